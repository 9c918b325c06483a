// What a plugin's flavour serves (include/keel/c/keel.h, "Streams"): a CPU
// plugin (device_cpu.cpp) takes CPU tensors only and no stream; a CUDA
// plugin (device_cuda.cpp, built with KEEL_WITH_CUDA) also takes CUDA
// tensors and runs a call on the caller's stream. CMake compiles one of the
// two into the plugin, so no #if chooses.
#pragma once

#include <cstdint>
#include <memory>

#include <c10/core/Device.h>

#include "keel/v1/error.h"

namespace keel::c_api {

// Whether this plugin takes tensors of DLPack device type `device_type`
// (kDLCPU always; kDLCUDA in a CUDA plugin).
bool serves_device(std::int32_t device_type);

// For a call's duration: the caller's stream made current on the call's
// device (a CUDA plugin), or nothing.
class StreamScope {
 public:
  StreamScope() = default;
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;
  virtual ~StreamScope() = default;
};

// Enters `stream` (a cudaStream_t, or NULL) for a call whose tensors are on
// `device`. NULL: libtorch's current stream (CUDA), or the CPU. A stream
// for a CPU call is `invalid_argument`.
result<std::unique_ptr<StreamScope>> enter_stream(void* stream, const c10::Device& device);

}  // namespace keel::c_api
