// keel's C ABI on CUDA (compiled in CUDA builds only; run by
// scripts/gpu-check.sh where there is a GPU): this build's plugin is the
// CUDA flavour, takes CUDA tensors in place, and runs a call on the stream
// the caller gives, with outputs equal to keel::v1's on the same tensors.
#include <string>

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include "conformance/adapters.h"
#include "conformance/c_api_support.h"
#include "keel/c/keel.hpp"
#include "keel/keel.h"

namespace keel {
namespace {

using CTensor = keel::c::Tensor;

using testing::bitwise;

const keel::c::Plugin& cuda_plugin() {
  return testing::this_plugin();
}

TEST(CApiCudaConformance, RunsOnTheCallersStreamAsV1Does) {
  if (const std::string why = testing::cuda_unavailable(); !why.empty()) GTEST_SKIP() << why;
  keel::c::Result<keel::c::PluginInfo> info = cuda_plugin().info();
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info.value().flavour.rfind("cu", 0), 0u) << info.value().flavour;
  const at::Device device(at::kCUDA, 0);
  // A decode step of 32 query heads over 8 kv heads, head dim 128.
  at::manual_seed(5);
  const auto make = [&](at::IntArrayRef shape) {
    return at::randn(shape, at::kDouble).to(at::kFloat).to(device);
  };
  const at::Tensor q = make({2, 32, 1, 128}), k = make({2, 8, 512, 128}),
                   v = make({2, 8, 512, 128});
  AttentionSpec spec;
  spec.return_lse = true;
  result<AttentionOutput> want = attention(q, k, v, spec);
  ASSERT_TRUE(want) << want.error().to_string();

  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(false, device.index());
  CTensor cq = CTensor::adopt(at::toDLPackVersioned(q)),
          ck = CTensor::adopt(at::toDLPackVersioned(k)),
          cv = CTensor::adopt(at::toDLPackVersioned(v));
  keel::c::Result<keel::c::AttentionResult> got =
      cuda_plugin().attention(cq, ck, cv, nullptr, true, stream.stream());
  ASSERT_TRUE(got) << got.error().message();
  stream.unwrap().synchronize();
  ASSERT_TRUE(got.value().out);
  EXPECT_EQ(got.value().out.get()->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(got.value().out.get()->dl_tensor.device.device_id, 0);
  const at::Tensor out = at::fromDLPackVersioned(got.value().out.release());
  const at::Tensor lse = at::fromDLPackVersioned(got.value().lse.release());
  EXPECT_TRUE(bitwise(out, want.value().out));
  EXPECT_TRUE(bitwise(lse, want.value().lse));

  // A stream with CPU tensors is an error value naming it.
  CTensor hq = CTensor::adopt(at::toDLPackVersioned(q.cpu())),
          hk = CTensor::adopt(at::toDLPackVersioned(k.cpu())),
          hv = CTensor::adopt(at::toDLPackVersioned(v.cpu()));
  keel::c::Result<keel::c::AttentionResult> cpu =
      cuda_plugin().attention(hq, hk, hv, nullptr, false, stream.stream());
  ASSERT_FALSE(cpu);
  EXPECT_NE(cpu.error().message().find("stream"), std::string::npos) << cpu.error().message();
}

}  // namespace
}  // namespace keel
