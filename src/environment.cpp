#include "environment.h"

#include <cstdlib>

#include <absl/strings/ascii.h>

namespace keel::internal {

std::optional<std::string> environment_value(const char* name) {
  const char* raw = std::getenv(name);
  if (raw == nullptr) return std::nullopt;
  const absl::string_view value = absl::StripAsciiWhitespace(raw);
  if (value.empty()) return std::nullopt;
  return std::string(value);
}

}  // namespace keel::internal
