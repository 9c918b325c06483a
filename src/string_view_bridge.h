// Debian 12's abseil is built with ABSL_OPTION_USE_STD_STRING_VIEW=0, so
// absl::string_view is its own type there, not std::string_view, and the
// two do not convert. keel's interfaces speak std::string_view; to_absl
// crosses to abseil's.
#pragma once

#include <string_view>

#include <absl/strings/string_view.h>

namespace keel::internal {

inline absl::string_view to_absl(std::string_view s) noexcept {
  return {s.data(), s.size()};
}

}  // namespace keel::internal
