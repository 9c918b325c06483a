// The per-chunk math of keel's fused linear cross-entropy
// (chunked_linear_cross_entropy.h): the inputs as the passes read them, the
// gradient buffers, the preallocated blocks, and what one block of logits
// contributes to the loss and to the gradients.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>

#include "loss_config.h"
#include "loss_plan.h"

namespace keel::kernels::loss {

// Which inputs want a gradient, decided before autograd's forward (where
// grad mode is off).
struct GradientsWanted {
  bool hidden = false;
  bool weight = false;
  bool bias = false;
  bool any() const { return hidden || weight || bias; }
};

// Gradient buffers: grad_hidden in hidden's dtype (each row is written by
// exactly one chunk), grad_weight and grad_bias in the accumulation dtype,
// summed over the chunks.
//
// grad_weight and grad_bias are sums over every token chunk. With many short
// chunks, adding each chunk's product into the running sum rounds that sum
// once per chunk, and the error grows with their number (issue 19: 1.7e-4
// of the largest entry at N = 131200, 64 rows a chunk, where one float32
// GEMM over all tokens stays at 0.7e-6). So, when the plan has more than
// 2 * kChunksPerPartial chunks and a second grad_weight fits in the block's
// own working set, chunks add into `*_partial` sums, which are added into the
// totals every kChunksPerPartial chunks: the totals round N / (rows *
// kChunksPerPartial) times. grad_bias ([V], cheap) is then summed in float64
// and rounded once.
constexpr std::int64_t kChunksPerPartial = 16;

struct Grads {
  at::Tensor hidden;
  at::Tensor weight;
  at::Tensor bias;
  at::Tensor weight_partial;  // defined when partial sums are on
  at::Tensor bias_partial;
  std::int64_t chunks_in_partial = 0;

  // Where a chunk adds its share.
  at::Tensor weight_sum() const { return weight_partial.defined() ? weight_partial : weight; }
  at::Tensor bias_sum() const { return bias_partial.defined() ? bias_partial : bias; }

  // After each token chunk, and (with `last`) after the last one.
  void end_chunk(bool last) {
    if (weight_partial.defined() && (++chunks_in_partial == kChunksPerPartial || last)) {
      weight.add_(weight_partial);
      chunks_in_partial = 0;
      if (last) {
        weight_partial = at::Tensor();
      } else {
        weight_partial.zero_();
      }
    }
    if (bias_partial.defined() && last) {
      bias.add_(bias_partial);
      bias_partial = at::Tensor();
    }
  }
};

// The class weights' terms that span the whole vocabulary: each token's
// w[y] ([N], accumulation dtype; a shard holds only some of them) and the
// sum of all w. Forward computes them (across the ranks for a shard) and
// backward reuses them.
struct TargetWeights {
  at::Tensor per_token;
  double sum = 0.0;
};

struct LossInputs {
  at::Tensor hidden;
  at::Tensor weight;
  at::Tensor bias;
  at::Tensor target;
  at::Tensor class_weights;      // detached, accumulation dtype, or undefined
  TargetWeights target_weights;  // defined with class_weights
  at::ScalarType acc = at::kFloat;
  ChunkPlan plan;                // plan.vocab <= weight.size(0)
  std::int64_t vocab = 0;        // the whole vocabulary (weight.size(0) unless sharded)
  std::int64_t vocab_start = 0;  // the class of weight's row 0
  const VocabShard* shard = nullptr;
  // Whether a block holds whole rows on every rank (on the largest shard).
  bool whole_rows_everywhere = false;

  // Whether classes [v0, v0 + v) are the whole vocabulary, all on this rank.
  bool whole_vocabulary(std::int64_t v0, std::int64_t v) const {
    return shard == nullptr && v0 == 0 && v == weight.size(0);
  }
  // Token targets in this rank's row numbering (may fall outside it).
  at::Tensor local_targets(const at::Tensor& y_safe) const {
    return vocab_start == 0 ? y_safe : y_safe - vocab_start;
  }
};

// Preallocated blocks, reused by every chunk: `block` in the accumulation
// dtype, `scratch` beside it when needed, `narrow` in the input dtype when
// that differs from the accumulation dtype.
class Workspace {
 public:
  Workspace(const LossInputs& p, const LinearCrossEntropyConfig& config, bool grad) {
    const std::int64_t elements = p.plan.tokens * p.plan.vocab;
    const auto options = p.hidden.options();
    block_ = at::empty({elements}, options.dtype(p.acc));
    if (needs_scratch(config, p.class_weights.defined(), grad)) {
      scratch_ = at::empty({elements}, options.dtype(p.acc));
    }
    if (p.hidden.scalar_type() != p.acc) {
      narrow_ = at::empty({elements}, options.dtype(p.hidden.scalar_type()));
    }
  }
  at::Tensor block(std::int64_t n, std::int64_t v) const { return view(block_, n, v); }
  at::Tensor scratch(std::int64_t n, std::int64_t v) const { return view(scratch_, n, v); }
  at::Tensor narrow(std::int64_t n, std::int64_t v) const { return view(narrow_, n, v); }

 private:
  static at::Tensor view(const at::Tensor& flat, std::int64_t n, std::int64_t v) {
    return flat.narrow(0, 0, n * v).view({n, v});
  }
  at::Tensor block_;
  at::Tensor scratch_;
  at::Tensor narrow_;
};

// The per-token quantities of one chunk: the target's logit, the
// class-weighted logit sum smoothing needs, and (written by the caller) lse.
struct TokenTerms {
  at::Tensor target_logit;  // [n]
  at::Tensor smooth_dot;    // [n], sum_c w[c] l[c]; undefined without smoothing
};

// The gradient factors of token i, already multiplied by its scale t_i (0
// for ignored tokens): d loss / d l = p * coef - hit * onehot(y) - t (s / V) w,
// with coef = t ((1 - s) w[y] + (s / V) sum(w) + 2 z lse) and
// hit = t (1 - s) w[y], times 1 - (l / c)^2 through the soft-cap.
struct GradFactors {
  at::Tensor coef;  // [n]
  at::Tensor hit;   // [n]
  at::Tensor tok;   // [n]
};

// Sums a 1-D tensor in an order that does not depend on the thread count:
// ATen splits a full reduction (one output) across threads once it has
// 32768 elements, so large inputs are first summed row by row (each row by
// one thread) in rows shorter than that.
at::Tensor ordered_sum(at::Tensor x);

// Row sums of a [n, V] block, keepdim, independent of the thread count
// (see ordered_sum: a single row is one output).
at::Tensor row_sum(const at::Tensor& block);

// `known`: the target weights forward computed, for backward (which then
// needs no collective); null in forward.
LossInputs make_loss_inputs(const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& target,
                            const at::Tensor& class_weights, const LinearCrossEntropyConfig& config,
                            bool grad, const TargetWeights* known = nullptr);

// Writes the (soft-capped) logits of classes [v0, v0 + out.size(1)) of the
// tokens `h` into `out`. PyTorch's semantics are F.linear(...).float(): the
// GEMM in the input dtype, then the loss in the accumulation dtype.
void logits_into(const at::Tensor& out, const LossInputs& p, const Workspace& ws,
                 const at::Tensor& h, std::int64_t v0, const LinearCrossEntropyConfig& config);

// Adds into `terms` what block `b` (classes [v0, v0 + b.size(1))) holds of
// the target logits and of the smoothing sum. `scratch` is a block-sized
// buffer for the weighted sum, or undefined when there are no weights.
void collect_terms(TokenTerms* terms, const at::Tensor& b, const at::Tensor& y_safe,
                   std::int64_t v0, const LossInputs& p, const LinearCrossEntropyConfig& config,
                   const at::Tensor& scratch);

// A shard's chunk: the whole vocabulary's lse and terms from every rank's
// (gathered in rank order, so that every rank gets the same bits): the lse
// by a log-sum-exp over the ranks, the target logit (held by one rank, 0 on
// the others) and the smoothing sum by a sum.
at::Tensor combine_shards(const LossInputs& p, const at::Tensor& lse, TokenTerms* terms);

// Token i's loss, with w the class weights (1 when none), s the smoothing,
// l the (soft-capped) logits and lse their log-sum-exp:
//   (1 - s) w[y] (lse - l[y]) + (s / V) sum_c w[c] (lse - l[c]) + z lse^2.
at::Tensor per_token_loss(const at::Tensor& lse, const TokenTerms& terms, const at::Tensor& w_y,
                          const at::Tensor& ignored, const LossInputs& p,
                          const LinearCrossEntropyConfig& config);

GradFactors grad_factors(const at::Tensor& lse, const at::Tensor& w_y, const at::Tensor& tok,
                         const LossInputs& p, const LinearCrossEntropyConfig& config);

// Turns block `g`, holding p * coef for classes [v0, v0 + g.size(1)), into
// the logit gradient; `deriv` holds 1 - (l / c)^2 when soft-capping.
void finish_logit_gradient(const at::Tensor& g, const GradFactors& f, const at::Tensor& y_safe,
                           std::int64_t v0, const LossInputs& p,
                           const LinearCrossEntropyConfig& config, const at::Tensor& deriv);

// 1 - (l / c)^2 of the capped logits in `b`, into `out`.
void softcap_derivative(at::Tensor out, const at::Tensor& b, double cap);

// Folds the logit gradient `g` of tokens [start, start + n) and classes
// [v0, v0 + g.size(1)) into the gradient buffers. `dx_acc` is the chunk's
// accumulation-dtype grad_hidden when it spans several vocabulary blocks
// and the input dtype is narrower; undefined otherwise.
void fold_gradient(Grads* grads, const at::Tensor& g, const LossInputs& p, const Workspace& ws,
                   const at::Tensor& h, std::int64_t start, std::int64_t v0, bool first_block,
                   const at::Tensor& dx_acc, const GradientsWanted& wants);

}  // namespace keel::kernels::loss
