// The compat adapter's linear_cross_entropy kernel.
#pragma once

#include "dispatch/linear_cross_entropy.h"
#include "keel/v1/build_info.h"

namespace keel::adapters {

class CompatLinearCrossEntropy final : public internal::LinearCrossEntropyKernel {
 public:
  internal::Support supports(const internal::LinearCrossEntropyCall& call) const override;
  internal::LinearCrossEntropyResult run(
      const internal::LinearCrossEntropyCall& call) const override;
  // What AdapterInfo lists for it.
  static CapabilityInfo info();
};

}  // namespace keel::adapters
