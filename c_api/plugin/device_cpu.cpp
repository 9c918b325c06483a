// A CPU plugin: CPU tensors, no stream (c_api/plugin/device.h).
#include <dlpack/dlpack.h>

#include "device.h"

namespace keel::c_api {

bool serves_device(std::int32_t device_type) {
  return device_type == kDLCPU;
}

result<std::unique_ptr<StreamScope>> enter_stream(void* stream, const c10::Device& /*device*/) {
  if (stream != nullptr) {
    return Error(Errc::invalid_argument, "stream must be NULL for CPU tensors");
  }
  return std::make_unique<StreamScope>();
}

}  // namespace keel::c_api
