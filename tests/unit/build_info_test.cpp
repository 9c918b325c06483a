#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <gtest/gtest.h>
#include <keel/keel.h>
#include <torch/csrc/api/include/torch/version.h>

namespace keel {
namespace {

// The expectation comes from libtorch's own header, not from keel's CMake.
std::string torch_header_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

TEST(BuildInfo, ReportsKeelAndTorchVersions) {
  const BuildInfo& info = build_info();
  EXPECT_EQ(info.keel_version, KEEL_VERSION_STRING);
  EXPECT_STREQ(version(), KEEL_VERSION_STRING);
  EXPECT_EQ(info.torch_version, torch_header_version());
  EXPECT_FALSE(info.compiler.empty());
}

TEST(BuildInfo, CompatAlwaysAndNativeExactlyFrom213) {
  const BuildInfo& info = build_info();
  ASSERT_FALSE(info.adapters.empty());
  EXPECT_EQ(info.adapters[0].name, "compat");
  const bool native_expected = TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 13;
  EXPECT_EQ(native_expected, static_cast<bool>(KEEL_TEST_EXPECT_NATIVE));
  ASSERT_EQ(info.adapters.size(), native_expected ? 2u : 1u);
  if (native_expected) {
    EXPECT_EQ(info.adapters[1].name, "native");
  }
  for (const AdapterInfo& a : info.adapters) {
    ASSERT_FALSE(a.capabilities.empty()) << a.name;
    EXPECT_EQ(a.capabilities[0].operation, "logsumexp");
  }
}

// What keel-info lists is what dispatch serves: for every adapter, every
// floating dtype is served under that adapter exactly when its capability
// lists it, and a feature a call needs exactly when it is listed.
const CapabilityInfo* capability(const AdapterInfo& a, const std::string& operation) {
  for (const CapabilityInfo& c : a.capabilities) {
    if (c.operation == operation) return &c;
  }
  return nullptr;
}

bool lists(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

Backend backend_named(const std::string& name) {
  return name == "native" ? Backend::native : Backend::compat;
}

const std::pair<at::ScalarType, const char*> kFloats[] = {{at::kHalf, "float16"},
                                                          {at::kBFloat16, "bfloat16"},
                                                          {at::kFloat, "float32"},
                                                          {at::kDouble, "float64"}};

// The error of a call, none when it was served.
template <typename R>
std::optional<Error> error_of(const R& r) {
  if (r) return std::nullopt;
  return r.error();
}

// One probe per operation and feature: a small call of `operation` in a
// dtype on a backend, which the adapter must serve exactly when its
// capability lists the dtype (and `feature`, when there is one).
struct Probe {
  const char* name;
  const char* operation;
  const char* feature;  // nullptr: the call needs no listed feature
  std::optional<Error> (*call)(Backend backend, at::ScalarType dtype);
};

const Probe kProbes[] = {
    {"logsumexp", "logsumexp", nullptr,
     [](Backend backend, at::ScalarType dtype) {
       LogsumexpOptions o;
       o.dispatch.backend = backend;
       return error_of(logsumexp(at::ones({2, 3}, dtype), o));
     }},
    {"logsumexp_mask", "logsumexp", "mask",
     [](Backend backend, at::ScalarType dtype) {
       LogsumexpOptions o;
       o.dispatch.backend = backend;
       o.mask = at::ones({2, 3}, at::kBool);
       return error_of(logsumexp(at::ones({2, 3}, dtype), o));
     }},
    {"linear_cross_entropy", "linear_cross_entropy", nullptr,
     [](Backend backend, at::ScalarType dtype) {
       LinearCrossEntropyOptions o;
       o.dispatch.backend = backend;
       return error_of(linear_cross_entropy(at::ones({4, 8}, dtype), at::ones({5, 8}, dtype),
                                            at::zeros({4}, at::kLong), o));
     }},
    {"attention", "attention", nullptr,
     [](Backend backend, at::ScalarType dtype) {
       AttentionSpec spec;
       spec.dispatch.backend = backend;
       const at::Tensor q = at::ones({1, 2, 3, 4}, dtype);
       return error_of(attention(q, q, q, spec));
     }},
};

class BuildInfoServes : public ::testing::TestWithParam<Probe> {};

TEST_P(BuildInfoServes, WhatItsCapabilityLists) {
  const Probe& p = GetParam();
  for (const AdapterInfo& a : build_info().adapters) {
    const CapabilityInfo* c = capability(a, p.operation);
    ASSERT_NE(c, nullptr) << a.name;
    for (const auto& [dtype, name] : kFloats) {
      SCOPED_TRACE(a.name + " " + name);
      const bool listed =
          lists(c->dtypes, name) && (p.feature == nullptr || lists(c->features, p.feature));
      const std::optional<Error> error = p.call(backend_named(a.name), dtype);
      EXPECT_EQ(!error.has_value(), listed);
      if (error) {
        EXPECT_EQ(error->code(), Errc::unsupported) << error->to_string();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryOperation, BuildInfoServes, ::testing::ValuesIn(kProbes),
                         [](const ::testing::TestParamInfo<Probe>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace keel
