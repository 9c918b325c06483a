// A CUDA plugin: CPU and CUDA tensors; a CUDA call runs on the caller's
// stream, made current on the tensors' device for the call, so that its
// work is ordered after what the caller queued there and its outputs are
// ready in that stream's order when the call returns (c_api/plugin/device.h).
#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>

#include <c10/core/StreamGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "device.h"

namespace keel::c_api {
namespace {

// c10's device-generic guard (its CUDA implementation lives in libc10_cuda),
// so that the plugin itself calls no CUDA runtime function.
class CudaStreamScope final : public StreamScope {
 public:
  explicit CudaStreamScope(c10::cuda::CUDAStream stream) : guard_(stream.unwrap()) {}

 private:
  c10::StreamGuard guard_;
};

}  // namespace

bool serves_device(std::int32_t device_type) {
  return device_type == kDLCPU || device_type == kDLCUDA;
}

result<std::unique_ptr<StreamScope>> enter_stream(void* stream, const c10::Device& device) {
  if (!device.is_cuda()) {
    if (stream != nullptr) {
      return Error(Errc::invalid_argument, "stream must be NULL for CPU tensors");
    }
    return std::make_unique<StreamScope>();
  }
  if (stream == nullptr) {
    // libtorch's current stream on the tensors' device.
    return std::unique_ptr<StreamScope>(
        new CudaStreamScope(c10::cuda::getCurrentCUDAStream(device.index())));
  }
  return std::unique_ptr<StreamScope>(new CudaStreamScope(
      c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), device.index())));
}

}  // namespace keel::c_api
