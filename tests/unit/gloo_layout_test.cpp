// keel compiles ProcessGroupGloo.hpp against Debian's gloo headers, while
// libtorch was compiled against the newer gloo it bundles (see
// adapters/c10d/c10d_backends.h). keel allocates ProcessGroupGloo and its Options with
// the sizes of its own view of the header, and the library's constructors
// and collectives fill them. Were the library's layout larger, it would
// write past keel's allocation: each object here sits in a buffer with a
// guard zone behind it, and the guard must come back untouched.
#include <gtest/gtest.h>

#include <cstring>
#include <new>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace {

constexpr unsigned char kGuard = 0xA5;
constexpr std::size_t kGuardBytes = 4096;

template <class T>
struct Guarded {
  alignas(64) unsigned char bytes[sizeof(T) + kGuardBytes];
  Guarded() { std::memset(bytes, kGuard, sizeof(bytes)); }
  bool guard_intact() const {
    for (std::size_t i = sizeof(T); i < sizeof(bytes); ++i) {
      if (bytes[i] != kGuard) return false;
    }
    return true;
  }
};

TEST(GlooLayout, OptionsStayInsideKeelsSize) {
  auto buffer = std::make_unique<Guarded<c10d::ProcessGroupGloo::Options>>();
  auto* options = new (buffer->bytes) c10d::ProcessGroupGloo::Options(std::chrono::seconds(5));
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  EXPECT_TRUE(buffer->guard_intact());
  EXPECT_EQ(options->timeout, std::chrono::milliseconds(5000));
  options->~Options();
}

TEST(GlooLayout, ProcessGroupGlooStaysInsideKeelsSizeThroughACollective) {
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(5));
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  options->threads = 2;
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto buffer = std::make_unique<Guarded<c10d::ProcessGroupGloo>>();
  auto* group = new (buffer->bytes) c10d::ProcessGroupGloo(store, 0, 1, options);
  EXPECT_TRUE(buffer->guard_intact());
  std::vector<at::Tensor> tensors{at::arange(10, at::kFloat)};
  group->allreduce(tensors)->wait();
  EXPECT_TRUE(at::equal(tensors[0], at::arange(10, at::kFloat)));
  EXPECT_EQ(group->getBackendName(), "gloo");
  EXPECT_EQ(group->getSize(), 1);
  EXPECT_TRUE(buffer->guard_intact());
  group->~ProcessGroupGloo();
  EXPECT_TRUE(buffer->guard_intact());
}

}  // namespace
