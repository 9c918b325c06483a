// The adapters compiled into this build, for parameterising conformance
// suites: every test runs on each.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <keel/keel.h>

namespace keel::testing {

inline std::vector<Backend> adapters_in_build() {
  std::vector<Backend> out;
  for (const AdapterInfo& a : build_info().adapters) {
    out.push_back(a.name == "native" ? Backend::native : Backend::compat);
  }
  return out;
}

inline std::string adapter_name(const ::testing::TestParamInfo<Backend>& info) {
  return std::string(to_string(info.param));
}

}  // namespace keel::testing
