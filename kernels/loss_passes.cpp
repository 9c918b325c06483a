#include "loss_passes.h"

#include <algorithm>

namespace keel::kernels::loss {

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

}  // namespace keel::kernels::loss
