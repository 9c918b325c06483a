// keel's fused linear cross-entropy on long-stable ATen ops (at::linear,
// at::logsumexp, gather/scatter, addmm): tokens are processed in chunks, so
// the [N, V] logits never exist; only one [chunk, V] block at a time does.
// When a gradient is needed, each chunk's logit gradient is formed right
// after its loss and folded into grad_hidden (its own rows) and into float32
// accumulators for grad_weight and grad_bias, so backward only scales them.
// For reduction none the upstream gradient is per token and unknown in
// forward, so backward recomputes the chunks instead.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace keel::compat {

enum class LossReduction : std::uint8_t { mean, sum, none };

struct LinearCrossEntropyConfig {
  LossReduction reduction = LossReduction::mean;
  std::int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  double z_loss = 0.0;
  double logit_softcap = 0.0;
  std::int64_t chunk_size = 1;  // >= 1
};

struct LinearCrossEntropyOutputs {
  at::Tensor loss;            // scalar, or [N] for none; carries autograd
  at::Tensor per_token_loss;  // [N], detached
  at::Tensor lse;             // [N], detached
};

// hidden [N, D] and weight [V, D] of one floating dtype; bias undefined or
// [V] of that dtype; target int64 [N] in [0, V) or ignore_index;
// class_weights undefined or floating [V]. Inputs are assumed valid.
LinearCrossEntropyOutputs chunked_linear_cross_entropy(const at::Tensor& hidden,
                                                       const at::Tensor& weight,
                                                       const at::Tensor& bias,
                                                       const at::Tensor& target,
                                                       const at::Tensor& class_weights,
                                                       const LinearCrossEntropyConfig& config);

}  // namespace keel::compat
