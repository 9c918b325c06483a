#include "chunked_linear_cross_entropy.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "accumulation.h"

namespace keel::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

// Sums a 1-D tensor in an order that does not depend on the thread count:
// ATen splits a full reduction (one output) across threads once it has
// 32768 elements, so large inputs are first summed row by row (each row by
// one thread) in rows shorter than that.
at::Tensor ordered_sum(at::Tensor x) {
  constexpr std::int64_t kRow = 4096;
  while (x.numel() > kRow) {
    const std::int64_t rows = (x.numel() + kRow - 1) / kRow;
    x = at::constant_pad_nd(x, {0, rows * kRow - x.numel()}).view({rows, kRow}).sum(1);
  }
  return x.sum();
}

// Row sums of a [n, V] block, keepdim, independent of the thread count
// (see ordered_sum: a single row is one output).
at::Tensor row_sum(const at::Tensor& block) {
  if (block.size(0) > 1) return block.sum(1, /*keepdim=*/true);
  return ordered_sum(block.view({-1})).view({1, 1});
}

// Each token's w[y] and the sum of w. A shard contributes the w[y] of the
// targets it holds (0 for the others, so the sum over the ranks is exact)
// and its own partial sum, gathered once.
TargetWeights target_weights(const LossInputs& p, const LinearCrossEntropyConfig& config) {
  const at::Tensor y_safe = p.target.masked_fill(p.target.eq(config.ignore_index), 0);
  const at::Tensor& cw = p.class_weights;
  if (p.shard == nullptr) return {cw.index_select(0, y_safe), ordered_sum(cw).item<double>()};
  const std::int64_t held = cw.size(0);
  const at::Tensor local = p.local_targets(y_safe);
  const at::Tensor outside = local.lt(0).logical_or_(local.ge(held));
  const at::Tensor mine = cw.index_select(0, local.clamp(0, held - 1)).masked_fill_(outside, 0);
  const at::Tensor all = p.shard->gather(at::cat({mine, ordered_sum(cw).reshape({1})})).sum(0);
  const std::int64_t n = p.target.size(0);
  return {all.narrow(0, 0, n), all[n].item<double>()};
}

// `known`: the target weights forward computed, for backward (which then
// needs no collective); null in forward.
LossInputs make_loss_inputs(const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& target,
                            const at::Tensor& class_weights, const LinearCrossEntropyConfig& config,
                            bool grad, const TargetWeights* known = nullptr) {
  LossInputs p;
  p.hidden = hidden;
  p.weight = weight;
  p.bias = bias;
  p.target = target;
  p.acc = accumulation_dtype(hidden.scalar_type(), config);
  p.shard = config.shard.get();
  p.vocab = p.shard != nullptr ? p.shard->vocab : weight.size(0);
  p.vocab_start = p.shard != nullptr ? p.shard->start : 0;
  if (class_weights.defined()) {
    p.class_weights = class_weights.detach().to(p.acc).contiguous();
    p.target_weights = known != nullptr ? *known : target_weights(p, config);
  }
  // Every rank plans for the largest shard, so that all cut the tokens
  // alike and make the same collectives.
  const std::int64_t planned = p.shard != nullptr ? p.shard->largest : weight.size(0);
  p.plan = plan_chunks(hidden.size(0), hidden.size(1), planned, hidden.scalar_type(), config,
                       class_weights.defined(), grad);
  p.whole_rows_everywhere = p.plan.vocab >= planned;
  p.plan.vocab = std::min(p.plan.vocab, weight.size(0));
  return p;
}

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

// Writes the (soft-capped) logits of classes [v0, v0 + out.size(1)) of the
// tokens `h` into `out`. PyTorch's semantics are F.linear(...).float(): the
// GEMM in the input dtype, then the loss in the accumulation dtype.
void logits_into(const at::Tensor& out, const LossInputs& p, const Workspace& ws,
                 const at::Tensor& h, std::int64_t v0, const LinearCrossEntropyConfig& config) {
  const std::int64_t n = out.size(0);
  const std::int64_t v = out.size(1);
  const at::Tensor w = p.weight.narrow(0, v0, v);
  at::Tensor gemm_out = p.hidden.scalar_type() == p.acc ? out : ws.narrow(n, v);
  if (p.bias.defined()) {
    at::addmm_out(gemm_out, p.bias.narrow(0, v0, v), h, w.t());
  } else {
    at::mm_out(gemm_out, h, w.t());
  }
  if (!gemm_out.is_same(out)) out.copy_(gemm_out);
  const double cap = config.logit_softcap;
  if (cap > 0) out.div_(cap).tanh_().mul_(cap);
}

// The per-token quantities of one chunk: the target's logit, the
// class-weighted logit sum smoothing needs, and (written by the caller) lse.
struct TokenTerms {
  at::Tensor target_logit;  // [n]
  at::Tensor smooth_dot;    // [n], sum_c w[c] l[c]; undefined without smoothing
};

// Adds into `terms` what block `b` (classes [v0, v0 + b.size(1))) holds of
// the target logits and of the smoothing sum. `scratch` is a block-sized
// buffer for the weighted sum, or undefined when there are no weights.
void collect_terms(TokenTerms* terms, const at::Tensor& b, const at::Tensor& y_safe,
                   std::int64_t v0, const LossInputs& p, const LinearCrossEntropyConfig& config,
                   const at::Tensor& scratch) {
  const std::int64_t v = b.size(1);
  if (p.whole_vocabulary(v0, v)) {
    terms->target_logit = b.gather(1, y_safe.unsqueeze(1)).squeeze(1);
  } else {
    const at::Tensor inside = y_safe.ge(v0).logical_and_(y_safe.lt(v0 + v));
    const at::Tensor local = (y_safe - v0).clamp_(0, v - 1).unsqueeze(1);
    const at::Tensor picked = b.gather(1, local).squeeze(1).masked_fill_(inside.logical_not(), 0);
    terms->target_logit.add_(picked);
  }
  if (config.label_smoothing > 0) {
    at::Tensor dot;
    if (p.class_weights.defined()) {
      at::Tensor weighted = scratch;
      at::mul_out(weighted, b, p.class_weights.narrow(0, v0, v));
      dot = row_sum(weighted).squeeze(1);
    } else {
      dot = row_sum(b).squeeze(1);
    }
    terms->smooth_dot.add_(dot);
  }
}

// A shard's chunk: the whole vocabulary's lse and terms from every rank's
// (gathered in rank order, so that every rank gets the same bits): the lse
// by a log-sum-exp over the ranks, the target logit (held by one rank, 0 on
// the others) and the smoothing sum by a sum.
at::Tensor combine_shards(const LossInputs& p, const at::Tensor& lse, TokenTerms* terms) {
  std::vector<at::Tensor> parts{lse, terms->target_logit};
  if (terms->smooth_dot.defined()) parts.push_back(terms->smooth_dot);
  const at::Tensor all = p.shard->gather(at::stack(parts));  // [ranks, parts, n]
  terms->target_logit = all.select(1, 1).sum(0);
  if (terms->smooth_dot.defined()) terms->smooth_dot = all.select(1, 2).sum(0);
  return at::logsumexp(all.select(1, 0), 0);
}

// Token i's loss, with w the class weights (1 when none), s the smoothing,
// l the (soft-capped) logits and lse their log-sum-exp:
//   (1 - s) w[y] (lse - l[y]) + (s / V) sum_c w[c] (lse - l[c]) + z lse^2.
at::Tensor per_token_loss(const at::Tensor& lse, const TokenTerms& terms, const at::Tensor& w_y,
                          const at::Tensor& ignored, const LossInputs& p,
                          const LinearCrossEntropyConfig& config) {
  const double s = config.label_smoothing;
  const auto vocab = static_cast<double>(p.vocab);
  at::Tensor loss = lse - terms.target_logit;
  if (w_y.defined()) loss.mul_(w_y);
  if (s > 0) {
    const double mass = p.class_weights.defined() ? p.target_weights.sum : vocab;
    const at::Tensor smooth = (lse * mass).sub_(terms.smooth_dot);
    loss.mul_(1.0 - s).add_(smooth, s / vocab);
  }
  if (config.z_loss > 0) loss.add_(lse.square(), config.z_loss);
  return loss.masked_fill_(ignored, 0.0);
}

// The gradient factors of token i, already multiplied by its scale t_i (0
// for ignored tokens): d loss / d l = p * coef - hit * onehot(y) - t (s / V) w,
// with coef = t ((1 - s) w[y] + (s / V) sum(w) + 2 z lse) and
// hit = t (1 - s) w[y], times 1 - (l / c)^2 through the soft-cap.
struct GradFactors {
  at::Tensor coef;  // [n]
  at::Tensor hit;   // [n]
  at::Tensor tok;   // [n]
};

GradFactors grad_factors(const at::Tensor& lse, const at::Tensor& w_y, const at::Tensor& tok,
                         const LossInputs& p, const LinearCrossEntropyConfig& config) {
  const double s = config.label_smoothing;
  const auto vocab = static_cast<double>(p.vocab);
  const double smooth_mass = s / vocab * (p.class_weights.defined() ? p.target_weights.sum : vocab);
  at::Tensor coef = w_y.defined() ? w_y * (1.0 - s) : at::full_like(lse, 1.0 - s);
  at::Tensor hit = coef * tok;
  coef.add_(smooth_mass);
  if (config.z_loss > 0) coef.add_(lse, 2.0 * config.z_loss);
  coef.mul_(tok);
  return {coef, hit, tok};
}

// Turns block `g`, holding p * coef for classes [v0, v0 + g.size(1)), into
// the logit gradient; `deriv` holds 1 - (l / c)^2 when soft-capping.
void finish_logit_gradient(const at::Tensor& g, const GradFactors& f, const at::Tensor& y_safe,
                           std::int64_t v0, const LossInputs& p,
                           const LinearCrossEntropyConfig& config, const at::Tensor& deriv) {
  const std::int64_t v = g.size(1);
  const double s = config.label_smoothing;
  const auto vocab = static_cast<double>(p.vocab);
  if (p.whole_vocabulary(v0, v)) {
    g.scatter_add_(1, y_safe.unsqueeze(1), f.hit.neg().unsqueeze(1));
  } else {
    const at::Tensor inside = y_safe.ge(v0).logical_and_(y_safe.lt(v0 + v));
    const at::Tensor local = (y_safe - v0).clamp_(0, v - 1).unsqueeze(1);
    g.scatter_add_(1, local, f.hit.neg().masked_fill_(inside.logical_not(), 0).unsqueeze(1));
  }
  if (s > 0) {
    if (p.class_weights.defined()) {
      g.addr_(f.tok, p.class_weights.narrow(0, v0, v), 1.0, -s / vocab);
    } else {
      g.sub_((f.tok * (s / vocab)).unsqueeze(1));
    }
  }
  if (deriv.defined()) g.mul_(deriv);
}

// 1 - (l / c)^2 of the capped logits in `b`, into `out`.
void softcap_derivative(at::Tensor out, const at::Tensor& b, double cap) {
  at::mul_out(out, b, b);
  out.mul_(-1.0 / (cap * cap)).add_(1.0);
}

// Folds the logit gradient `g` of tokens [start, start + n) and classes
// [v0, v0 + g.size(1)) into the gradient buffers. `dx_acc` is the chunk's
// accumulation-dtype grad_hidden when it spans several vocabulary blocks
// and the input dtype is narrower; undefined otherwise.
void fold_gradient(Grads* grads, const at::Tensor& g, const LossInputs& p, const Workspace& ws,
                   const at::Tensor& h, std::int64_t start, std::int64_t v0, bool first_block,
                   const at::Tensor& dx_acc, const GradientsWanted& wants) {
  const std::int64_t n = g.size(0);
  const std::int64_t v = g.size(1);
  const at::Tensor w = p.weight.narrow(0, v0, v);
  if (wants.hidden) {
    at::Tensor g_in = g;
    if (g.scalar_type() != p.weight.scalar_type()) {
      g_in = ws.narrow(n, v);
      g_in.copy_(g);
    }
    if (dx_acc.defined()) {
      dx_acc.add_(at::mm(g_in, w));
    } else {
      at::Tensor rows = grads->hidden.narrow(0, start, n);
      if (first_block) {
        at::mm_out(rows, g_in, w);
      } else {
        rows.addmm_(g_in, w);
      }
    }
  }
  if (wants.weight) {
    const at::Tensor h_acc = h.scalar_type() == p.acc ? h : h.to(p.acc);
    at::Tensor dw = grads->weight_sum().narrow(0, v0, v);
    dw.addmm_(g.t(), h_acc);
  }
  if (wants.bias) grads->bias_sum().narrow(0, v0, v).add_(g.sum(0));
}

// One pass over the token chunks, whole rows or vocabulary blocks. Writes
// the per-token loss and lse when asked (non-null). When `grads` is
// non-null it adds each token's logit gradient times token_scale[i] (0 for
// ignored tokens) into the buffers; with whole rows that happens in the
// same pass, from the block's exponentials.
void forward_pass(const LossInputs& p, const LinearCrossEntropyConfig& config,
                  const at::Tensor& token_scale, at::Tensor* per_token, at::Tensor* lse,
                  Grads* grads, const GradientsWanted& wants) {
  const std::int64_t n_tokens = p.hidden.size(0);
  const std::int64_t vocab = p.weight.size(0);
  TORCH_INTERNAL_ASSERT(grads == nullptr || p.plan.vocab == vocab,
                        "gradients in forward need whole rows");
  const Workspace ws(p, config, grads != nullptr);
  const at::Tensor& cw = p.class_weights;
  for (std::int64_t start = 0; start < n_tokens; start += p.plan.tokens) {
    const std::int64_t n = std::min(p.plan.tokens, n_tokens - start);
    const at::Tensor h = p.hidden.narrow(0, start, n);
    const at::Tensor y = p.target.narrow(0, start, n);
    const at::Tensor ignored = y.eq(config.ignore_index);
    const at::Tensor y_safe = p.local_targets(y.masked_fill(ignored, 0));
    const at::Tensor w_y =
        cw.defined() ? p.target_weights.per_token.narrow(0, start, n) : at::Tensor();
    const auto acc_options = p.hidden.options().dtype(p.acc);

    TokenTerms terms;
    if (!p.whole_vocabulary(0, p.plan.vocab)) terms.target_logit = at::zeros({n}, acc_options);
    if (config.label_smoothing > 0) terms.smooth_dot = at::zeros({n}, acc_options);
    at::Tensor running_max;  // [n, 1]
    at::Tensor running_sum;  // [n, 1], of exp(l - running_max)
    at::Tensor deriv;
    for (std::int64_t v0 = 0; v0 < vocab; v0 += p.plan.vocab) {
      const std::int64_t v = std::min(p.plan.vocab, vocab - v0);
      const at::Tensor b = ws.block(n, v);
      logits_into(b, p, ws, h, v0, config);
      collect_terms(&terms, b, y_safe, v0, p, config,
                    cw.defined() && config.label_smoothing > 0 ? ws.scratch(n, v) : at::Tensor());
      if (grads != nullptr && config.logit_softcap > 0) {
        deriv = ws.scratch(n, v);
        softcap_derivative(deriv, b, config.logit_softcap);
      }
      // Online log-sum-exp: the block's exponentials are taken against the
      // running maximum, and the running sum is rescaled when it grows.
      // Finite inputs give finite logits, so every maximum is finite.
      const at::Tensor block_max = b.amax(1, /*keepdim=*/true);
      const at::Tensor new_max =
          running_max.defined() ? at::maximum(running_max, block_max) : block_max;
      b.sub_(new_max).exp_();
      const at::Tensor block_sum = row_sum(b);
      if (running_max.defined()) {
        running_sum.mul_((running_max - new_max).exp_()).add_(block_sum);
      } else {
        running_sum = block_sum;
      }
      running_max = new_max;
    }
    at::Tensor lse_c = running_sum.log().add_(running_max).squeeze(1);
    if (p.shard != nullptr) lse_c = combine_shards(p, lse_c, &terms);
    if (per_token != nullptr) {
      per_token->narrow(0, start, n).copy_(per_token_loss(lse_c, terms, w_y, ignored, p, config));
    }
    if (lse != nullptr) lse->narrow(0, start, n).copy_(lse_c);
    if (grads == nullptr) continue;

    // Whole rows: the block still holds exp(l - max); scaled by
    // coef / sum it is p * coef, and becomes the logit gradient in place. A
    // shard's sum is not the whole vocabulary's: it scales by
    // coef * exp(max - lse) instead.
    const GradFactors f = grad_factors(lse_c, w_y, token_scale.narrow(0, start, n), p, config);
    const at::Tensor g = ws.block(n, vocab);
    const at::Tensor coef = f.coef.unsqueeze(1);
    g.mul_(p.shard == nullptr ? coef / running_sum
                              : coef * (running_max - lse_c.unsqueeze(1)).exp_());
    finish_logit_gradient(g, f, y_safe, 0, p, config, deriv);
    fold_gradient(grads, g, p, ws, h, start, 0, /*first_block=*/true, at::Tensor(), wants);
    grads->end_chunk(start + n >= n_tokens);
  }
}

// The gradient by recomputation, from the saved per-token lse: each block's
// logits again, their softmax exp(l - lse) in place, then the gradient.
void gradient_pass(const LossInputs& p, const LinearCrossEntropyConfig& config,
                   const at::Tensor& token_scale, const at::Tensor& lse, Grads* grads,
                   const GradientsWanted& wants) {
  const std::int64_t n_tokens = p.hidden.size(0);
  const std::int64_t vocab = p.weight.size(0);
  const Workspace ws(p, config, /*grad=*/true);
  const at::Tensor& cw = p.class_weights;
  const bool blocks = p.plan.vocab < vocab;
  for (std::int64_t start = 0; start < n_tokens; start += p.plan.tokens) {
    const std::int64_t n = std::min(p.plan.tokens, n_tokens - start);
    const at::Tensor h = p.hidden.narrow(0, start, n);
    const at::Tensor y = p.target.narrow(0, start, n);
    const at::Tensor y_safe = p.local_targets(y.masked_fill(y.eq(config.ignore_index), 0));
    const at::Tensor w_y =
        cw.defined() ? p.target_weights.per_token.narrow(0, start, n) : at::Tensor();
    const at::Tensor lse_c = lse.narrow(0, start, n);
    const GradFactors f = grad_factors(lse_c, w_y, token_scale.narrow(0, start, n), p, config);
    const at::Tensor lse_col = lse_c.unsqueeze(1);
    const at::Tensor coef_col = f.coef.unsqueeze(1);
    // Several blocks add into one row of grad_hidden: in the accumulation
    // dtype when the input dtype is narrower.
    at::Tensor dx_acc;
    if (wants.hidden && blocks && p.hidden.scalar_type() != p.acc) {
      dx_acc = at::zeros({n, p.hidden.size(1)}, p.hidden.options().dtype(p.acc));
    }
    for (std::int64_t v0 = 0; v0 < vocab; v0 += p.plan.vocab) {
      const std::int64_t v = std::min(p.plan.vocab, vocab - v0);
      const at::Tensor g = ws.block(n, v);
      logits_into(g, p, ws, h, v0, config);
      at::Tensor deriv;
      if (config.logit_softcap > 0) {
        deriv = ws.scratch(n, v);
        softcap_derivative(deriv, g, config.logit_softcap);
      }
      g.sub_(lse_col).exp_().mul_(coef_col);
      finish_logit_gradient(g, f, y_safe, v0, p, config, deriv);
      fold_gradient(grads, g, p, ws, h, start, v0, v0 == 0, dx_acc, wants);
    }
    if (dx_acc.defined()) grads->hidden.narrow(0, start, n).copy_(dx_acc);
    grads->end_chunk(start + n >= n_tokens);
  }
}

Grads allocate_grads(const LossInputs& p, const GradientsWanted& wants) {
  Grads grads;
  const auto acc = p.hidden.options().dtype(p.acc);
  if (wants.hidden) grads.hidden = at::empty(p.hidden.sizes(), p.hidden.options());
  if (wants.weight) grads.weight = at::zeros(p.weight.sizes(), acc);
  if (wants.bias) grads.bias = at::zeros({p.weight.size(0)}, acc);
  const std::int64_t chunks = (p.hidden.size(0) + p.plan.tokens - 1) / p.plan.tokens;
  if (chunks > 2 * kChunksPerPartial) {
    if (wants.weight && p.weight.numel() <= p.plan.tokens * p.plan.vocab) {
      grads.weight_partial = at::zeros_like(grads.weight);
    }
    if (wants.bias) grads.bias_partial = at::zeros_like(grads.bias, at::kDouble);
  }
  return grads;
}

// The factor each token's gradient carries: 1 / denominator for mean (sum
// of w[y] over non-ignored tokens), 1 for sum; 0 for ignored tokens, so
// that an all-ignored mean has zero (not NaN) gradients, as in PyTorch.
std::pair<at::Tensor, at::Tensor> scale_and_denominator(const LossInputs& p,
                                                        const LinearCrossEntropyConfig& config) {
  const at::Tensor kept = p.target.ne(config.ignore_index);
  at::Tensor denominator;
  if (p.class_weights.defined()) {
    denominator = ordered_sum(p.target_weights.per_token.mul(kept));
  } else {
    denominator = kept.sum().to(p.acc);
  }
  const at::Tensor per_token = config.reduction == Reduction::mean
                                   ? denominator.reciprocal()
                                   : at::ones({}, denominator.options());
  return {at::where(kept, per_token, at::zeros({}, per_token.options())), denominator};
}

at::Tensor reduce(const at::Tensor& per_token, const at::Tensor& denominator, Reduction reduction) {
  switch (reduction) {
    case Reduction::mean:
      return ordered_sum(per_token) / denominator;  // 0 / 0 = NaN when all ignored
    case Reduction::sum:
      return ordered_sum(per_token);
    case Reduction::none:
      break;
  }
  return per_token.clone();
}

// What backward needs beside the saved tensors, typed: the call's config,
// which inputs want a gradient, and (when forward formed them) the
// gradients that the first backward takes over.
struct SavedState : torch::CustomClassHolder {
  LinearCrossEntropyConfig config;
  GradientsWanted wants;
  at::ScalarType weight_dtype = at::kFloat;
  double class_weight_sum = 0.0;
  bool gradients_ready = false;  // forward formed the gradients
  bool consumed = false;         // and a backward took them
  Grads grads;
};

// The tensors saved for the recomputing backward, in this order.
enum Slot : std::size_t {
  kHidden,
  kWeight,
  kBias,
  kTarget,
  kClassWeights,
  kTargetWeights,
  kLse,
  kScale,
};

// Whether the gradients are formed in forward (whole rows, mean or sum) or
// recomputed in backward from the saved lse. Decided alike on every rank of
// a shard's group.
bool gradients_in_forward(const LossInputs& p, const LinearCrossEntropyConfig& config) {
  return config.reduction != Reduction::none && p.whole_rows_everywhere;
}

// An upstream gradient of exactly 1 (what loss.backward() sends) needs no
// scaling pass over the gradient buffers. Checked only on CPU, where
// reading it back costs no device synchronisation.
bool is_exactly_one(const at::Tensor& upstream) {
  return upstream.device().is_cpu() && upstream.numel() == 1 && upstream.item<double>() == 1.0;
}

class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  // Returns {loss, lse, per_token_loss}; the last two carry no gradient.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                               const at::Tensor& target,
                               const std::optional<at::Tensor>& class_weights_or_none,
                               const LinearCrossEntropyConfig& config,
                               const GradientsWanted& wants) {
    const at::Tensor b = bias.value_or(at::Tensor());
    const at::Tensor class_weights = class_weights_or_none.value_or(at::Tensor());
    const LossInputs p = make_loss_inputs(hidden, weight, b, target, class_weights, config, true);
    auto [scale, denominator] = scale_and_denominator(p, config);
    at::Tensor per_token = at::empty({hidden.size(0)}, hidden.options().dtype(p.acc));
    at::Tensor lse = at::empty_like(per_token);
    auto state = c10::make_intrusive<SavedState>();
    state->config = config;
    state->wants = wants;
    state->weight_dtype = weight.scalar_type();
    state->class_weight_sum = p.target_weights.sum;
    if (gradients_in_forward(p, config)) {
      state->grads = allocate_grads(p, wants);
      forward_pass(p, config, scale, &per_token, &lse, &state->grads, wants);
      if (p.shard != nullptr && wants.hidden) p.shard->sum(state->grads.hidden);
      state->gradients_ready = true;
    } else {
      // Backward recomputes the blocks from the saved lse, with the
      // upstream gradient (per token for none).
      forward_pass(p, config, {}, &per_token, &lse, nullptr, wants);
      ctx->save_for_backward(
          {hidden, weight, b, target, class_weights, p.target_weights.per_token, lse, scale});
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    at::Tensor loss = reduce(per_token, denominator, config.reduction);
    ctx->mark_non_differentiable({lse, per_token});
    return {loss, lse, per_token};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "keel::linear_cross_entropy: a second-order gradient (create_graph=true) is not "
                "supported: keel computes the gradients inside the forward pass, so they are "
                "not differentiable; use the naive at::linear + at::cross_entropy_loss for "
                "double backward");
    auto* state = dynamic_cast<SavedState*>(ctx->saved_data["state"].toCapsule().get());
    TORCH_INTERNAL_ASSERT(state != nullptr, "keel::linear_cross_entropy: no saved state");
    const LinearCrossEntropyConfig& config = state->config;
    const GradientsWanted& wants = state->wants;
    const at::Tensor& upstream = grad_outputs[0];
    Grads grads;
    if (!state->gradients_ready) {
      const variable_list saved = ctx->get_saved_variables();
      const TargetWeights known{saved[kTargetWeights], state->class_weight_sum};
      const LossInputs p =
          make_loss_inputs(saved[kHidden], saved[kWeight], saved[kBias], saved[kTarget],
                           saved[kClassWeights], config, true, &known);
      // The scale is 1 / denominator (mean) or 1 per kept token, 0 per
      // ignored one; the upstream gradient is a scalar or per token.
      const at::Tensor scale = saved[kScale] * upstream.to(p.acc);
      grads = allocate_grads(p, wants);
      gradient_pass(p, config, scale, saved[kLse], &grads, wants);
      if (p.shard != nullptr && wants.hidden) p.shard->sum(grads.hidden);
    } else {
      TORCH_CHECK(!state->consumed,
                  "keel::linear_cross_entropy: backward ran twice through one loss with "
                  "reduction mean or sum; keel hands its precomputed gradients to the first "
                  "backward (to save memory), so compute the loss again for a second one");
      state->consumed = true;
      // The saved gradients are handed over and scaled in place: keeping a
      // copy would double the weight gradient's memory.
      grads = std::exchange(state->grads, Grads());
      if (!is_exactly_one(upstream)) {
        for (at::Tensor* t : {&grads.hidden, &grads.weight, &grads.bias}) {
          if (t->defined()) t->mul_(upstream);
        }
      }
    }
    if (grads.weight.defined()) grads.weight = grads.weight.to(state->weight_dtype);
    if (grads.bias.defined()) grads.bias = grads.bias.to(state->weight_dtype);
    return {grads.hidden, grads.weight, grads.bias, {}, {}, {}, {}};
  }
};

}  // namespace

LinearCrossEntropyOutputs chunked_linear_cross_entropy(const at::Tensor& hidden,
                                                       const at::Tensor& weight,
                                                       const at::Tensor& bias,
                                                       const at::Tensor& target,
                                                       const at::Tensor& class_weights,
                                                       const LinearCrossEntropyConfig& config) {
  GradientsWanted wants;
  if (at::GradMode::is_enabled()) {
    wants.hidden = hidden.requires_grad();
    wants.weight = weight.requires_grad();
    wants.bias = bias.defined() && bias.requires_grad();
  }
  if (!wants.any()) {
    // No gradient is wanted: one forward pass, no gradient buffers, no
    // autograd node.
    at::NoGradGuard no_grad;
    const LossInputs p =
        make_loss_inputs(hidden, weight, bias, target, class_weights, config, false);
    auto [scale, denominator] = scale_and_denominator(p, config);
    at::Tensor per_token = at::empty({hidden.size(0)}, hidden.options().dtype(p.acc));
    at::Tensor lse = at::empty_like(per_token);
    forward_pass(p, config, {}, &per_token, &lse, nullptr, wants);
    at::Tensor loss = reduce(per_token, denominator, config.reduction);
    return {loss, per_token, lse};
  }
  // Optional inputs go in as std::optional: an empty one is not an autograd
  // input at all.
  const auto optional = [](const at::Tensor& t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
  };
  const variable_list out = LinearCrossEntropyFunction::apply(
      hidden, weight, optional(bias), target,
      optional(class_weights.defined() ? class_weights.detach() : at::Tensor()), config, wants);
  return {out[0], out[2], out[1]};
}

}  // namespace keel::kernels
