// The compat adapter's linear_cross_entropy kernel.
#pragma once

#include "dispatch/linear_cross_entropy.h"

namespace keel::adapters {

class CompatLinearCrossEntropy final : public internal::LinearCrossEntropyKernel {
 public:
  const internal::Capability& capability() const noexcept override;
  internal::LinearCrossEntropyResult run(
      const internal::LinearCrossEntropyCall& call) const override;
};

}  // namespace keel::adapters
