// The linear_cross_entropy capability: what the core hands an adapter after
// validation.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "dispatch/adapter.h"
#include "keel/v1/loss.h"

namespace keel::internal {

// A validated call: `hidden` is [N, D] (already flattened), `weight` [V, D]
// of the same dtype and device, `target` int64 [N] with every entry in
// [0, V) or equal to options.ignore_index, `bias` and `class_weights`
// undefined or [V]; chunk sizes, budget and accumulation dtype in
// `options` are valid (0 = automatic), and the adapter resolves them.
struct LinearCrossEntropyCall {
  const at::Tensor& hidden;
  const at::Tensor& weight;
  const at::Tensor& target;
  const LinearCrossEntropyOptions& options;
};

// Per-token tensors are [N]; the core reshapes them to target's shape.
struct LinearCrossEntropyResult {
  at::Tensor loss;
  at::Tensor per_token_loss;
  at::Tensor lse;
};

class LinearCrossEntropyKernel {
 public:
  virtual ~LinearCrossEntropyKernel() = default;
  virtual Support supports(const LinearCrossEntropyCall& call) const = 0;
  // May throw (c10::Error, std::exception): the core turns it into an Error.
  virtual LinearCrossEntropyResult run(const LinearCrossEntropyCall& call) const = 0;
};

}  // namespace keel::internal
