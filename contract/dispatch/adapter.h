// The interface every adapter implements. An adapter hands out one kernel
// object per operation (a null kernel for one it lacks); each kernel holds
// its Capability, which both the dispatcher (supports()) and keel-info
// (AdapterInfo, assembled from the kernels) read.
#pragma once

#include <string>

#include "dispatch/capability.h"
#include "keel/v1/dispatch.h"

namespace keel::internal {

class LinearCrossEntropyKernel;
class AttentionKernel;
class CommKernel;
class LogsumexpKernel;

class Adapter {
 public:
  virtual ~Adapter() = default;

  // Backend::compat or Backend::native.
  virtual Backend kind() const noexcept = 0;
  // What the adapter is, in a sentence, for AdapterInfo.
  virtual std::string description() const = 0;

  virtual const LogsumexpKernel* logsumexp() const noexcept { return nullptr; }
  virtual const LinearCrossEntropyKernel* linear_cross_entropy() const noexcept { return nullptr; }
  virtual const AttentionKernel* attention() const noexcept { return nullptr; }
  virtual const CommKernel* comm() const noexcept { return nullptr; }
};

}  // namespace keel::internal
