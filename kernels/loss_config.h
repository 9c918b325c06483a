// The configuration of keel's fused linear cross-entropy kernel
// (chunked_linear_cross_entropy.h), which its planner (loss_plan.h) reads too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>

#include "keel/v1/loss.h"

namespace keel::kernels {

// Vocabulary parallelism: this rank's weight (and bias, class weights) hold
// classes [start, start + weight.size(0)) of `vocab` classes, the other
// ranks of a group the rest; hidden and target are the same on every rank.
// The kernel combines per-token vectors across the ranks, never [N, V]
// blocks: per token chunk one `gather` of [k, n] (the local lse, target
// logit and smoothing sum; rank order, so every rank computes bitwise the
// same loss), once per call the class weights of the targets and their sum,
// and grad_hidden once through `sum`. Both callbacks throw on failure. Every
// rank must make the same calls in the same order, so the chunking is
// planned for `largest` classes on every rank, and whether the gradients
// are formed in forward is decided for that largest shard.
struct VocabShard {
  std::int64_t start = 0;    // the first class of this rank's shard
  std::int64_t vocab = 0;    // the whole vocabulary, V
  std::int64_t largest = 0;  // the largest shard's class count
  // [k...] -> [ranks, k...]: every rank's tensor, in rank order.
  std::function<at::Tensor(const at::Tensor&)> gather;
  // Elementwise sum across the ranks, in place.
  std::function<void(const at::Tensor&)> sum;
};

struct LinearCrossEntropyConfig {
  Reduction reduction = Reduction::mean;  // keel/v1/loss.h's
  std::int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  double z_loss = 0.0;
  double logit_softcap = 0.0;
  std::int64_t chunk_size = 0;        // tokens per chunk; 0 = from the budget
  std::int64_t vocab_chunk_size = 0;  // classes per block; 0 = from the budget
  std::int64_t budget_bytes = 0;      // 0 = automatic
  // float32 or float64; Undefined = float64 for float64 input, else float32.
  at::ScalarType accumulation = at::ScalarType::Undefined;
  // Set for a vocabulary-parallel call; null for the whole vocabulary.
  std::shared_ptr<const VocabShard> shard;
};

}  // namespace keel::kernels
