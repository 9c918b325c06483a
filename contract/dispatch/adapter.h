// The interface every adapter implements. An adapter declares what it can
// serve (AdapterInfo for people, Support answers for the dispatcher) and
// hands out one kernel object per capability; a capability it lacks is a
// null kernel.
#pragma once

#include <string>
#include <utility>

#include "keel/v1/build_info.h"
#include "keel/v1/dispatch.h"

namespace keel::internal {

class LinearCrossEntropyKernel;
class AttentionKernel;
class CommKernel;
class LogsumexpKernel;

// A kernel's answer to "can you serve this call?", with the reason when not.
struct Support {
  bool ok = true;
  std::string reason;

  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
};

class Adapter {
 public:
  virtual ~Adapter() = default;

  // Backend::compat or Backend::native.
  virtual Backend kind() const noexcept = 0;
  virtual AdapterInfo info() const = 0;

  virtual const LogsumexpKernel* logsumexp() const noexcept { return nullptr; }
  virtual const LinearCrossEntropyKernel* linear_cross_entropy() const noexcept { return nullptr; }
  virtual const AttentionKernel* attention() const noexcept { return nullptr; }
  virtual const CommKernel* comm() const noexcept { return nullptr; }
};

}  // namespace keel::internal
