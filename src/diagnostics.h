// keel's log channels, switched on by KEEL_LOG (a comma-separated list of
// channels, or "all"): "dispatch" logs every adapter decision, "comm" every
// collective. Lines go to stderr, one write each.
//
// Debian 12's abseil (20220623) predates absl/log, so keel formats its own
// lines with absl::StrCat and absl::FormatTime, under an absl::Mutex.
#pragma once

#include <string_view>

namespace keel::internal {

// Whether `channel` is on in KEEL_LOG. Reads the environment each time, so
// a service can flip it between calls.
bool log_enabled(std::string_view channel);

// Writes "[keel <channel> <UTC time>] <message>" to stderr.
void log_line(std::string_view channel, std::string_view message);

}  // namespace keel::internal
