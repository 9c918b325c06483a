/// @file keel/v1/loss.h
/// @brief `keel::linear_cross_entropy`: the cross-entropy of a linear
/// projection, computed without ever holding the `[N, V]` logits.
///
/// A language model's last layer multiplies hidden states `[N, D]` by an
/// output embedding `[V, D]` and takes the cross-entropy of the `[N, V]`
/// logits. With a large vocabulary those logits (and their gradient) are
/// the largest tensors of the step. `keel::linear_cross_entropy` computes
/// the same loss chunk by chunk of tokens, so that only a `[chunk, V]` block
/// lives at a time, and computes the gradients for hidden, weight and bias in
/// the same pass. It means what PyTorch means by
/// `F.cross_entropy(F.linear(h, W, b).float(), y, weight=class_weights,
/// ignore_index=ignore_index, label_smoothing=label_smoothing,
/// reduction=reduction)`, plus the optional logit soft-capping and z-loss
/// described on `LinearCrossEntropyOptions`.
///
/// In one line:
/// `auto r = keel::linear_cross_entropy(hidden, weight, targets, options);`
/// then `r.value().loss`.
///
/// In full:
///
/// @snippet examples/snippets/header_snippets.cpp loss
///
/// Traps:
/// - Every call's `keel::result` is `[[nodiscard]]`: ignoring one is a
///   warning (an error under `-Werror`); drop one on purpose with `(void)`.
/// - With `Reduction::mean`, a call whose targets are all `ignore_index`
///   gives NaN (0 / 0), as PyTorch does; its gradients are 0.
/// - With class weights, `Reduction::mean` divides by the sum of the class
///   weights of the non-ignored targets, not by their count (PyTorch's rule).
/// - A second-order gradient (`create_graph = true` through the loss) is an
///   error thrown by autograd (a `c10::Error` naming keel), never a silently
///   wrong number: the gradients are computed inside the forward pass.
/// - For `mean` and `sum` with whole rows (the default unless the
///   vocabulary is too large for the budget) the forward pass computes the
///   gradients and the first backward takes them over (no second copy of
///   grad_weight is kept), so a second backward through the same loss, even
///   with `retain_graph = true`, is the same kind of error. `none`, and any
///   reduction with vocabulary blocks, recomputes in backward and can be
///   backpropagated more than once.
/// - `class_weights` and `target` get no gradient.
/// - Results depend (within rounding) on the chunk sizes, since grad_weight
///   is summed chunk by chunk and the log-sum-exp block by block; for given
///   chunk sizes and thread count they are bitwise reproducible. Across
///   thread counts they agree to float32 rounding, not bitwise: the BLAS may
///   split a gradient GEMM's long inner dimension across threads (MKL does).
///   The automatic plan differs between a call that wants a gradient and
///   one that does not, so their losses may differ in the last bits.
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "keel/v1/comm.h"
#include "keel/v1/dispatch.h"
#include "keel/v1/error.h"
#include "keel/v1/export.h"

namespace keel {
inline namespace v1 {

/// How per-token losses are combined, as in PyTorch's `reduction`.
enum class Reduction : std::uint8_t {
  /// Sum of the per-token losses divided by the sum of the weights of the
  /// non-ignored targets (their count without class weights).
  mean = 0,
  /// Sum of the per-token losses.
  sum,
  /// The per-token losses, in `target`'s shape; ignored tokens give 0.
  none,
};

/// The least working-set budget, in bytes, that the automatic chunk sizes
/// (`LinearCrossEntropyOptions::chunk_size = 0`, `vocab_chunk_size = 0`) are
/// chosen for when `chunk_budget_bytes` is 0: 8 MiB.
///
/// That automatic budget is an eighth of the size of the gradients of
/// `hidden` and `weight` in the accumulation dtype, `(N + V) * D` elements
/// (memory a training step holds anyway), and at least this constant. So a
/// step's peak stays within 9/8 of its gradients plus per-token vectors,
/// while the chunks stay tall enough for the GEMMs to run near full speed
/// (at N = 4096, D = 1024, V = 32768 in float32 the budget is 18 MiB, 144
/// whole rows; what that costs and saves against the naive loss is measured
/// in docs/benchmarks.md). Set `chunk_budget_bytes` to trade one for the
/// other.
///
/// The working set is one `[tokens, classes]` block in the accumulation
/// dtype, reused in place for the logits, their exponentials and their
/// gradient, plus a second such block when label smoothing meets class
/// weights or soft-capping needs a gradient, plus one in the input dtype
/// when that is narrower than the accumulation dtype. Inputs, outputs, the
/// gradients themselves and per-token vectors are not part of it. The
/// automatic plan takes whole rows (every class of a token in one block) as
/// long as at least 32 tokens fit; beyond that (a vocabulary too large for
/// the budget) it cuts the vocabulary into blocks for chunks of 512 tokens.
/// When no gradient is wanted (no_grad, or no input requires one) it takes
/// vocabulary blocks for chunks of 1024 tokens whenever fewer whole rows
/// fit: the forward is then one GEMM, faster in tall blocks.
constexpr std::int64_t kLinearCrossEntropyChunkBudgetBytes = std::int64_t{8} << 20;

/// The output embedding sharded by vocabulary across the ranks of a
/// communicator, as tensor-parallel training holds it (Megatron's
/// vocabulary-parallel cross-entropy).
///
/// Each rank passes its own shard: `weight` `[V_r, D]` holds classes
/// `[vocab_start, vocab_start + V_r)` of the whole vocabulary, and so do
/// `bias` and `class_weights` (`[V_r]`). The shards of the group's ranks
/// must tile `[0, V)` with no gap or overlap, in any order and of any sizes
/// (at least one class each); V is where they end. `hidden` and `target`
/// are the same on every rank (replicated activations), and targets are
/// classes of the whole vocabulary. Every rank of the group calls
/// `linear_cross_entropy` with the same options, in the same order as its
/// other collectives.
///
/// Every rank gets the whole vocabulary's loss, per-token loss and lse,
/// bitwise the same on each, and every option keeps its meaning over the
/// whole vocabulary (label smoothing's `s / V` and class-weight sum, the
/// mean's denominator, z-loss, soft-capping, ignore_index). `hidden`'s
/// gradient is the whole loss's (summed across the ranks), `weight`'s and
/// `bias`'s the rank's own shard's. The ranks exchange per-token vectors,
/// never `[N, V]` blocks: one all_gather of the call's layout, one of a
/// few `[chunk]` vectors per token chunk, one of `[N]` with class weights,
/// and one all_reduce of `grad_hidden` (`[N, D]`, in hidden's dtype).
///
/// Errors: `invalid_argument` when a rank's arguments are wrong (that rank
/// names them; the others name the rank) or the ranks disagree (the
/// message names the field and the ranks), and the communicator's own
/// `peer_lost`, `timeout` or `aborted` when a collective fails, on every
/// rank that took part. The gradients are formed inside the forward call
/// for `mean` and `sum` with whole rows; otherwise backward recomputes
/// them, and a collective that fails there makes `backward()` throw a
/// `std::runtime_error` whose message is the `keel::Error`'s `to_string()`.
struct VocabParallelOptions {
  /// The ranks that share the vocabulary. Unset (the default): the call is
  /// not sharded, and `weight` holds the whole vocabulary.
  std::optional<comm::Communicator> communicator;
  /// The class of this rank's first `weight` row, `>= 0`.
  std::int64_t vocab_start = 0;
  /// Bounds each collective of the call (default: the communicator's
  /// timeout).
  comm::CallOptions call;
};

/// Options of `keel::linear_cross_entropy`. Every member has a default, so a
/// caller sets only what it means.
struct LinearCrossEntropyOptions {
  /// How per-token losses are combined.
  Reduction reduction = Reduction::mean;
  /// Tokens whose target equals this contribute neither loss nor gradient
  /// (PyTorch's default, -100). It may also be a valid class in [0, V).
  std::int64_t ignore_index = -100;
  /// PyTorch's label smoothing, in [0, 1]: token i's loss is
  /// `(1 - s) * w[y_i] * (-log p[y_i]) + (s / V) * sum_c w[c] * (-log p[c])`,
  /// with `w` the class weights (all 1 when undefined).
  double label_smoothing = 0.0;
  /// Optional per-class weights `[V]`, floating point, on hidden's device.
  /// Undefined (the default) weighs every class 1. They get no gradient.
  at::Tensor class_weights;
  /// The z-loss coefficient z >= 0 (0 = off): every non-ignored token adds
  /// `z * lse_i^2` to its loss, with `lse_i` the log-sum-exp of its
  /// (soft-capped) logits. The term is not multiplied by class weights, and
  /// it is reduced with the cross-entropy: summed for `sum`, divided by the
  /// same denominator for `mean`, and part of the per-token value for
  /// `none`.
  double z_loss = 0.0;
  /// Logit soft-capping c >= 0 (0 = off): logits become `c * tanh(z / c)`
  /// (after the bias) before the softmax, as in Gemma 2.
  double logit_softcap = 0.0;
  /// Optional bias `[V]`, the same dtype and device as `weight`; it gets a
  /// gradient when it requires one. Undefined (the default) means none.
  at::Tensor bias;
  /// Tokens per chunk; 0 (the default) chooses from the budget
  /// (`chunk_budget_bytes`). Negative is an error. Given alone (with
  /// `vocab_chunk_size = 0`), each chunk takes whole rows.
  std::int64_t chunk_size = 0;
  /// Classes per vocabulary block; 0 (the default) chooses from the budget:
  /// whole rows unless fewer than 32 of them fit it (without a gradient:
  /// fewer than 1024, see `kLinearCrossEntropyChunkBudgetBytes`). With blocks smaller
  /// than the vocabulary, forward runs an online log-sum-exp over the
  /// blocks and keeps only the per-token lse, and backward recomputes the
  /// logits block by block (one GEMM more than the naive loss, in exchange
  /// for a working set independent of V). Negative is an error.
  std::int64_t vocab_chunk_size = 0;
  /// The working-set budget in bytes the automatic chunk sizes are chosen
  /// for; 0 (the default) means automatic: an eighth of the gradients'
  /// size, at least `kLinearCrossEntropyChunkBudgetBytes` (see there).
  /// Negative is an error.
  std::int64_t chunk_budget_bytes = 0;
  /// The dtype the softmax, the loss and grad_weight / grad_bias are
  /// accumulated in: `c10::ScalarType::Float` or `c10::ScalarType::Double`.
  /// `Undefined` (the default) means float32, or float64 for float64
  /// input. float32 with float64 input, and any other dtype, is an error.
  /// The logits GEMM runs in the input dtype either way (PyTorch's
  /// `F.linear(...).float()`), and the loss comes back in this dtype.
  c10::ScalarType accumulation_dtype = c10::ScalarType::Undefined;
  /// Also return the per-token loss (`LossOutput::per_token_loss`).
  bool return_per_token_loss = false;
  /// Also return the per-token log-sum-exp (`LossOutput::lse`).
  bool return_lse = false;
  /// Shards `weight` by vocabulary across a communicator's ranks (see
  /// `VocabParallelOptions`); by default it holds the whole vocabulary.
  VocabParallelOptions vocab_parallel;
  /// Which adapter serves the call.
  DispatchOptions dispatch;
};

/// The result of `keel::linear_cross_entropy`.
struct LossOutput {
  /// The loss: a scalar for `mean` and `sum`, `target`'s shape for `none`,
  /// in the accumulation dtype (float32 for float16/bfloat16/float32 input,
  /// float64 for float64, unless `accumulation_dtype` says otherwise). It
  /// carries autograd to hidden, weight and bias when they require grad.
  at::Tensor loss;
  /// With `return_per_token_loss`: the per-token loss (target's shape, 0 for
  /// ignored tokens, z-loss included), detached. Undefined otherwise.
  at::Tensor per_token_loss;
  /// With `return_lse`: the log-sum-exp of each token's (soft-capped)
  /// logits, target's shape, detached. Undefined otherwise.
  at::Tensor lse;
  /// Which adapter served the call, and why.
  DispatchInfo dispatch;
};

/// Computes the cross-entropy of `hidden @ weight^T (+ bias)` against
/// `target`, chunk by chunk of tokens.
///
/// `hidden` is `[N, D]` or `[B, T, D]`, `weight` `[V, D]`, both float16,
/// bfloat16, float32 or float64 of the same dtype and device; `target` is
/// int64 of hidden's leading shape (`[N]` or `[B, T]`), every entry in
/// [0, V) or equal to `ignore_index`. Inputs may be non-contiguous or
/// expanded. Errors: `invalid_argument` for bad arguments (the message names
/// the argument), `unsupported` when the requested adapter cannot serve the
/// call, `backend_error` when libtorch fails.
KEEL_API result<LossOutput> linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                                 const at::Tensor& target,
                                                 const LinearCrossEntropyOptions& options = {});

}  // namespace v1
}  // namespace keel
