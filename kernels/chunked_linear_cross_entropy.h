// keel's fused linear cross-entropy on long-stable ATen ops (mm/addmm into
// preallocated blocks, in-place exp and reductions, gather/scatter): tokens
// are processed in chunks, so the [N, V] logits never exist; only one
// [chunk, V] block at a time does, reused in place (logits -> exp -> logit
// gradient).
//
// Two schedules, chosen by plan_chunks():
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

#include <cstdint>
#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>

#include "keel/v1/loss.h"

namespace keel::kernels {

// The working-set budget the automatic chunk sizes are chosen for, when the
// caller gives none (budget_bytes = 0): an eighth of the gradients of hidden
// and weight in the accumulation dtype ((N + V) * D elements), which a
// training step holds anyway, and at least kMinAutomaticBudgetBytes. Small
// row chunks cost time (each repacks all of W for its GEMMs and rewrites all
// of grad_weight), a large block costs memory (the measured trade-off is in
// docs/benchmarks.md).
constexpr std::int64_t kMinAutomaticBudgetBytes = std::int64_t{8} << 20;
constexpr std::int64_t kGradientBytesPerBudgetByte = 8;

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

// How a call is cut: `tokens` rows per chunk, `vocab` classes per block
// (vocab == V: whole rows, no vocabulary blocks).
struct ChunkPlan {
  std::int64_t tokens = 1;
  std::int64_t vocab = 1;
};

// The accumulation dtype a config resolves to for an input dtype.
at::ScalarType accumulation_dtype(at::ScalarType input, const LinearCrossEntropyConfig& config);

// The chunking of a call with `n_tokens` tokens of `features` dimensions and
// `vocab` classes. An explicit chunk_size / vocab_chunk_size is kept
// (clamped to N / V); with both automatic, whole rows are used when at least
// kMinRowsPerChunk of them fit the budget, else vocabulary blocks of
// kRowsPerVocabBlock tokens; without a gradient (`grad` false), vocabulary
// blocks of 1024 tokens whenever fewer whole rows fit.
ChunkPlan plan_chunks(std::int64_t n_tokens, std::int64_t features, std::int64_t vocab,
                      at::ScalarType input, const LinearCrossEntropyConfig& config,
                      bool class_weights, bool grad);

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
