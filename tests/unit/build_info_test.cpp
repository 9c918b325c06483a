#include <string>

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

}  // namespace
}  // namespace keel
