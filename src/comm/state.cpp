#include "comm/state.h"

#include <absl/strings/str_cat.h>

#include "diagnostics.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define KEEL_LEAK_SANITIZER 1
#endif
#elif defined(__SANITIZE_ADDRESS__)
#define KEEL_LEAK_SANITIZER 1
#endif
#ifndef KEEL_LEAK_SANITIZER
#define KEEL_LEAK_SANITIZER 0
#endif
#if KEEL_LEAK_SANITIZER
#include <sanitizer/lsan_interface.h>
#endif

namespace {

// Marks a deliberately leaked object for LeakSanitizer (a no-op without it).
void ignore_leak([[maybe_unused]] const void* object) {
#if KEEL_LEAK_SANITIZER
  __lsan_ignore_object(object);
#endif
}

}  // namespace

namespace keel {
inline namespace v1 {
namespace comm::detail {

GroupState::~GroupState() {
  // A backend with work that never finished (a dead peer, a timeout, an
  // abort) would block its destructor on its worker threads until Gloo's
  // own timeout: keel leaves it to the process instead.
  if (aborted.load() || pending.load() > 0) {
    // Told to LeakSanitizer, so that the sanitizer build reports only
    // leaks nobody meant.
    ignore_leak(engine.get());
    (void)engine.release();  // NOLINT(bugprone-unused-return-value): leaked on purpose
    if (internal::log_enabled("comm")) {
      internal::log_line("comm", absl::StrCat(name, " rank ", rank,
                                              ": aborted group released without joining "
                                              "its backend's threads"));
    }
  }
}

}  // namespace comm::detail
}  // namespace v1
}  // namespace keel
