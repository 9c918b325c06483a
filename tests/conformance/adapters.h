// The adapters compiled into this build, for parameterising conformance
// suites: every test runs on each; and whether the CUDA variants can run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <keel/keel.h>

namespace keel::testing {

// The seed every conformance fixture sets in SetUp(), so that each test
// draws the same inputs whichever tests ran before it (or alone, or in
// parallel processes).
inline constexpr std::uint64_t kSeed = 20261203;

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

// The reason `adapter` declines attention, or "" when it serves it (asked
// with a one-element call; validation passes, so only dispatch can refuse).
inline std::string attention_refusal(Backend adapter) {
  const at::Tensor x = at::zeros({1, 1, 1, 8});
  AttentionSpec probe;
  probe.dispatch.backend = adapter;
  auto r = attention(x, x, x, probe);
  if (!r && r.error().code() == Errc::unsupported) return r.error().message();
  return {};
}

// Why the CUDA variants of the suites cannot run here, or "" when they can:
// a CUDA test starts with
//   if (auto why = cuda_unavailable(); !why.empty()) GTEST_SKIP() << why;
inline std::string cuda_unavailable() {
  if (!build_info().cuda) return "keel was built without KEEL_WITH_CUDA (no CUDA paths to test)";
  // at::hasCUDA() is false both without libtorch_cuda and without a device.
  if (!at::hasCUDA()) return "built with CUDA, but libtorch sees no CUDA device (or no driver)";
  return {};
}

}  // namespace keel::testing
