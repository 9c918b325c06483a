#include "comm/state.h"

#include <cstdlib>
#include <thread>

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

namespace {

// keel's detached threads: never destroyed, as a thread may still count
// itself out after the exit drain gave up on it.
struct Detached {
  std::mutex mutex;
  std::condition_variable cv;
  int running = 0;
  int registered = 0;  // exit drains registered
};

Detached& detached() {
  static auto* const d = new Detached;  // NOLINT(cppcoreguidelines-owning-memory): immortal
  return *d;
}

void drain_detached_threads() {
  Detached& d = detached();
  std::unique_lock<std::mutex> lock(d.mutex);
  (void)d.cv.wait_for(lock, kExitDrain, [&] { return d.running == 0; });
}

// The drain is registered again for each of the process's first detached
// threads: exit handlers run last-registered first, and libtorch builds
// some of its statics lazily, on a collective's first call. By the
// sixteenth, those of every path a detached thread takes exist.
constexpr int kExitDrainRegistrations = 16;

}  // namespace

void run_detached(std::function<void()> body) {
  Detached& d = detached();
  bool register_drain = false;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    ++d.running;
    if (d.registered < kExitDrainRegistrations) {
      ++d.registered;
      register_drain = true;
    }
  }
  if (register_drain) (void)std::atexit(drain_detached_threads);
  std::thread([body = std::move(body)]() mutable {
    body();
    body = nullptr;  // its captures (c10d work, the group) go first
    Detached& self = detached();
    std::lock_guard<std::mutex> lock(self.mutex);
    --self.running;
    self.cv.notify_all();
  }).detach();
}

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
