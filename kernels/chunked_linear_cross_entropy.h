// keel's fused linear cross-entropy on long-stable ATen ops (mm/addmm into
// preallocated blocks, in-place exp and reductions, gather/scatter): tokens
// are processed in chunks, so the [N, V] logits never exist; only one
// [chunk, V] block at a time does, reused in place (logits -> exp -> logit
// gradient).
//
// Two schedules, chosen by plan_chunks() (loss_plan.h):
// - whole rows (the vocabulary fits one block): when a gradient is needed
//   and the reduction is mean or sum, each chunk's logit gradient is formed
//   right after its loss and folded into grad_hidden (its own rows) and into
//   the accumulation-dtype grad_weight / grad_bias handed to autograd, so
//   backward only scales them: the same three GEMMs as the naive loss.
// - vocabulary blocks (a [chunk, V] block does not fit the budget, or the
//   caller asked for them): forward runs an online log-sum-exp over the
//   blocks and keeps only the per-token lse; backward recomputes each block's
//   logits (a fourth GEMM) and forms the gradient block by block.
// reduction none always recomputes in backward, since the per-token upstream
// gradient is unknown in forward.
#pragma once

#include <ATen/core/Tensor.h>

#include "loss_config.h"
#include "loss_plan.h"

namespace keel::kernels {

struct LinearCrossEntropyOutputs {
  at::Tensor loss;            // scalar, or [N] for none; carries autograd
  at::Tensor per_token_loss;  // [N], detached
  at::Tensor lse;             // [N], detached
};

// hidden [N, D] and weight [V, D] of one floating dtype; bias undefined or
// [V] of that dtype; target int64 [N] in [0, V) or ignore_index;
// class_weights undefined or floating [V]. Inputs are assumed valid. With
// config.shard, V is the shard's class count and targets are in [0,
// shard->vocab); the results are the whole vocabulary's, the same on every
// rank, and grad_hidden is summed across the ranks.
LinearCrossEntropyOutputs chunked_linear_cross_entropy(const at::Tensor& hidden,
                                                       const at::Tensor& weight,
                                                       const at::Tensor& bias,
                                                       const at::Tensor& target,
                                                       const at::Tensor& class_weights,
                                                       const LinearCrossEntropyConfig& config);

}  // namespace keel::kernels
