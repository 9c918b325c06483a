// Reading keel's environment variables. Read on each use, never cached, so
// tests and operators can change them between calls.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace keel::internal {

// The variable's value with surrounding blanks removed, or nullopt when it
// is unset or blank.
std::optional<std::string> environment_value(const char* name);

}  // namespace keel::internal
