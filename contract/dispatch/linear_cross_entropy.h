// The linear_cross_entropy capability: what the core hands an adapter after
// validation.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>

#include "dispatch/adapter.h"
#include "keel/v1/loss.h"

namespace keel::internal {

// A validated call: `hidden` is [N, D] (already flattened), `weight` [V, D]
// of the same dtype and device, `target` int64 [N] with every entry in
// [0, V) or equal to options.ignore_index, `bias` and `class_weights`
// undefined or [V]; chunk sizes, budget and accumulation dtype in
// `options` are valid (0 = automatic), and the adapter resolves them.
struct LinearCrossEntropyCall;

// A vocabulary-parallel call's layout, which every rank of the group agreed
// on before dispatch: this rank holds classes [start, start + weight.size(0))
// of `vocab`, the largest shard holds `largest`. The collectives throw
// internal::ErrorException on failure: `gather` returns every rank's
// tensor stacked in rank order ([ranks, ...]); `sum` adds in place.
struct VocabShard {
  std::int64_t start = 0;
  std::int64_t vocab = 0;
  std::int64_t largest = 0;
  std::function<at::Tensor(const at::Tensor&)> gather;
  std::function<void(const at::Tensor&)> sum;
};

struct LinearCrossEntropyCall {
  const at::Tensor& hidden;
  const at::Tensor& weight;
  const at::Tensor& target;
  const LinearCrossEntropyOptions& options;
  // Set for a vocabulary-parallel call (then targets are in [0, vocab)).
  const VocabShard* shard = nullptr;
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
  // What it serves; supports() and keel-info read this one value.
  virtual const Capability& capability() const noexcept = 0;
  Support supports(const LinearCrossEntropyCall& call) const {
    return capability().admits(call.hidden.scalar_type(), call.hidden.device().type());
  }
  // May throw (c10::Error, std::exception): the core turns it into an Error.
  virtual LinearCrossEntropyResult run(const LinearCrossEntropyCall& call) const = 0;
};

}  // namespace keel::internal
