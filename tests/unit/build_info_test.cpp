#include <algorithm>
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

TEST(BuildInfo, LogsumexpServesWhatItsCapabilityLists) {
  for (const AdapterInfo& a : build_info().adapters) {
    const CapabilityInfo* c = capability(a, "logsumexp");
    ASSERT_NE(c, nullptr) << a.name;
    for (const auto& [dtype, name] : kFloats) {
      SCOPED_TRACE(a.name + " " + name);
      LogsumexpOptions o;
      o.dispatch.backend = backend_named(a.name);
      const at::Tensor x = at::ones({2, 3}, dtype);
      EXPECT_EQ(static_cast<bool>(logsumexp(x, o)), lists(c->dtypes, name));
      o.mask = at::ones({2, 3}, at::kBool);
      EXPECT_EQ(static_cast<bool>(logsumexp(x, o)),
                lists(c->dtypes, name) && lists(c->features, "mask"));
    }
  }
}

TEST(BuildInfo, LinearCrossEntropyServesWhatItsCapabilityLists) {
  for (const AdapterInfo& a : build_info().adapters) {
    const CapabilityInfo* c = capability(a, "linear_cross_entropy");
    ASSERT_NE(c, nullptr) << a.name;
    for (const auto& [dtype, name] : kFloats) {
      SCOPED_TRACE(a.name + " " + name);
      LinearCrossEntropyOptions o;
      o.dispatch.backend = backend_named(a.name);
      const auto r = linear_cross_entropy(at::ones({4, 8}, dtype), at::ones({5, 8}, dtype),
                                          at::zeros({4}, at::kLong), o);
      EXPECT_EQ(static_cast<bool>(r), lists(c->dtypes, name));
      if (!r) {
        EXPECT_EQ(r.error().code(), Errc::unsupported);
      }
    }
  }
}

TEST(BuildInfo, AttentionServesWhatItsCapabilityLists) {
  for (const AdapterInfo& a : build_info().adapters) {
    const CapabilityInfo* c = capability(a, "attention");
    ASSERT_NE(c, nullptr) << a.name;
    for (const auto& [dtype, name] : kFloats) {
      SCOPED_TRACE(a.name + " " + name);
      AttentionSpec spec;
      spec.dispatch.backend = backend_named(a.name);
      const at::Tensor q = at::ones({1, 2, 3, 4}, dtype);
      const auto r = attention(q, q, q, spec);
      EXPECT_EQ(static_cast<bool>(r), lists(c->dtypes, name));
      if (!r) {
        EXPECT_EQ(r.error().code(), Errc::unsupported);
      }
    }
  }
}

}  // namespace
}  // namespace keel
