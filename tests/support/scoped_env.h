// Sets (or, for nullptr, unsets) one environment variable for a scope and
// restores what it found: the value it had, or its absence. The one guard
// every test uses, so that no test clobbers a variable CI set for later ones.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace keel::testing {

class ScopedEnv {
 public:
  ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const char* value) const {
    if (value != nullptr) {
      ::setenv(name_.c_str(), value, 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace keel::testing
