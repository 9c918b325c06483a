#include "loss_chunk.h"

#include <algorithm>
#include <vector>

namespace keel::kernels::loss {

namespace {

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

}  // namespace

at::Tensor ordered_sum(at::Tensor x) {
  constexpr std::int64_t kRow = 4096;
  while (x.numel() > kRow) {
    const std::int64_t rows = (x.numel() + kRow - 1) / kRow;
    x = at::constant_pad_nd(x, {0, rows * kRow - x.numel()}).view({rows, kRow}).sum(1);
  }
  return x.sum();
}

at::Tensor row_sum(const at::Tensor& block) {
  if (block.size(0) > 1) return block.sum(1, /*keepdim=*/true);
  return ordered_sum(block.view({-1})).view({1, 1});
}

LossInputs make_loss_inputs(const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& target,
                            const at::Tensor& class_weights, const LinearCrossEntropyConfig& config,
                            bool grad, const TargetWeights* known) {
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

at::Tensor combine_shards(const LossInputs& p, const at::Tensor& lse, TokenTerms* terms) {
  std::vector<at::Tensor> parts{lse, terms->target_logit};
  if (terms->smooth_dot.defined()) parts.push_back(terms->smooth_dot);
  const at::Tensor all = p.shard->gather(at::stack(parts));  // [ranks, parts, n]
  terms->target_logit = all.select(1, 1).sum(0);
  if (terms->smooth_dot.defined()) terms->smooth_dot = all.select(1, 2).sum(0);
  return at::logsumexp(all.select(1, 0), 0);
}

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

void softcap_derivative(at::Tensor out, const at::Tensor& b, double cap) {
  at::mul_out(out, b, b);
  out.mul_(-1.0 / (cap * cap)).add_(1.0);
}

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

}  // namespace keel::kernels::loss
