// The logsumexp capability: what the core hands an adapter after validation.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "dispatch/adapter.h"
#include "keel/v1/logsumexp.h"

namespace keel::internal {

// A validated call: `dim` is wrapped into [0, input.dim()), `mask` is either
// undefined or a bool tensor broadcastable to `input`.
struct LogsumexpCall {
  const at::Tensor& input;
  const at::Tensor& mask;
  std::int64_t dim;
  bool keepdim;
};

class LogsumexpKernel {
 public:
  virtual ~LogsumexpKernel() = default;
  // What it serves; supports() and keel-info read this one value.
  virtual const Capability& capability() const noexcept = 0;
  Support supports(const LogsumexpCall& call) const {
    const c10::ScalarType dtype = call.input.scalar_type();
    const c10::DeviceType device = call.input.device().type();
    if (call.mask.defined()) return capability().admits(dtype, device, {kFeatureMask});
    return capability().admits(dtype, device);
  }
  // May throw (c10::Error, std::exception): the core turns it into an Error.
  virtual at::Tensor run(const LogsumexpCall& call) const = 0;
};

}  // namespace keel::internal
