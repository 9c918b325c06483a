#include "diagnostics.h"

#include <cstdio>
#include <string>

#include <absl/strings/ascii.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <absl/synchronization/mutex.h>
#include <absl/time/clock.h>
#include <absl/time/time.h>

#include "environment.h"
#include "string_view_bridge.h"

namespace keel::internal {

bool log_enabled(std::string_view channel) {
  const std::optional<std::string> value = environment_value("KEEL_LOG");
  if (!value) return false;
  for (absl::string_view item : absl::StrSplit(*value, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item == to_absl(channel) || item == "all") return true;
  }
  return false;
}

void log_line(std::string_view channel, std::string_view message) {
  static absl::Mutex mutex(absl::kConstInit);
  const std::string line =
      absl::StrCat("[keel ", to_absl(channel), " ",
                   absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()), "] ",
                   to_absl(message), "\n");
  absl::MutexLock lock(&mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace keel::internal
