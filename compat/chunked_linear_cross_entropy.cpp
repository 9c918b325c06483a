#include "chunked_linear_cross_entropy.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace keel::compat {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Which inputs want a gradient, decided before autograd's forward (where
// grad mode is off).
struct Wants {
  bool hidden = false;
  bool weight = false;
  bool bias = false;
  bool any() const { return hidden || weight || bias; }
};

// Gradient buffers: grad_hidden in hidden's dtype (each row is written by
// exactly one chunk), grad_weight and grad_bias in the accumulation dtype
// (float32 for half types), summed over the chunks.
struct Grads {
  at::Tensor hidden;
  at::Tensor weight;
  at::Tensor bias;
};

struct Problem {
  const at::Tensor& hidden;
  const at::Tensor& weight;
  const at::Tensor& bias;
  const at::Tensor& target;
  at::Tensor class_weights;  // detached, accumulation dtype, or undefined
  double class_weight_sum = 0.0;
  at::ScalarType acc = at::kFloat;
};

Problem make_problem(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                     const at::Tensor& target, const at::Tensor& class_weights) {
  Problem p{hidden,
            weight,
            bias,
            target,
            {},
            0.0,
            hidden.scalar_type() == at::kDouble ? at::kDouble : at::kFloat};
  if (class_weights.defined()) {
    p.class_weights = class_weights.detach().to(p.acc).contiguous();
    p.class_weight_sum = p.class_weights.sum().item<double>();
  }
  return p;
}

// One pass over the token chunks. Writes the per-token loss and lse when
// asked (non-null), and, when `grads` is non-null, adds each token's logit
// gradient times token_scale[i] (0 for ignored tokens) into the buffers.
//
// Token i's loss, with w the class weights (1 when none), s the smoothing,
// l the (soft-capped) logits and lse their log-sum-exp:
//   (1 - s) w[y] (lse - l[y]) + (s / V) sum_c w[c] (lse - l[c]) + z lse^2,
// so d loss / d l = p * ((1 - s) w[y] + (s / V) sum(w) + 2 z lse)
//                   - (1 - s) w[y] onehot(y) - (s / V) w,
// times 1 - (l / c)^2 through the soft-cap c * tanh(. / c).
void run_chunks(const Problem& p, const LinearCrossEntropyConfig& config,
                const at::Tensor& token_scale, at::Tensor* per_token, at::Tensor* lse, Grads* grads,
                const Wants& wants) {
  const std::int64_t n_tokens = p.hidden.size(0);
  const std::int64_t vocab = p.weight.size(0);
  const double s = config.label_smoothing;
  const double z = config.z_loss;
  const double cap = config.logit_softcap;
  const at::Tensor& cw = p.class_weights;
  for (std::int64_t start = 0; start < n_tokens; start += config.chunk_size) {
    const std::int64_t n = std::min(config.chunk_size, n_tokens - start);
    const at::Tensor h = p.hidden.narrow(0, start, n);
    const at::Tensor y = p.target.narrow(0, start, n);
    at::Tensor logits = at::linear(h, p.weight, p.bias);
    // PyTorch's semantics are F.linear(...).float(): the GEMM in the input
    // dtype (accumulating in float32 inside), then the loss in float32.
    if (logits.scalar_type() != p.acc) logits = logits.to(p.acc);
    if (cap > 0) logits.div_(cap).tanh_().mul_(cap);
    // One exp pass serves both the log-sum-exp and, rescaled in place, the
    // softmax of the gradient. Finite inputs give finite logits, so the row
    // maximum is finite and the shift is safe.
    const at::Tensor row_max = logits.amax(1, /*keepdim=*/true);
    at::Tensor softmax = (logits - row_max).exp_();
    const at::Tensor row_sum = softmax.sum(1, /*keepdim=*/true);
    const at::Tensor lse_c = row_sum.log().add_(row_max).squeeze(1);
    const at::Tensor ignored = y.eq(config.ignore_index);
    const at::Tensor y_safe = y.masked_fill(ignored, 0).unsqueeze(1);
    const at::Tensor w_y = cw.defined() ? cw.index_select(0, y_safe.squeeze(1)) : at::Tensor();

    if (per_token != nullptr) {
      at::Tensor loss = lse_c - logits.gather(1, y_safe).squeeze(1);
      if (w_y.defined()) loss.mul_(w_y);
      if (s > 0) {
        const at::Tensor smooth = cw.defined() ? lse_c * p.class_weight_sum - at::mv(logits, cw)
                                               : lse_c * static_cast<double>(vocab) - logits.sum(1);
        loss.mul_(1.0 - s).add_(smooth, s / static_cast<double>(vocab));
      }
      if (z > 0) loss.add_(lse_c.square(), z);
      per_token->narrow(0, start, n).copy_(loss.masked_fill_(ignored, 0.0));
    }
    if (lse != nullptr) lse->narrow(0, start, n).copy_(lse_c);
    if (grads == nullptr) continue;

    const at::Tensor tok = token_scale.narrow(0, start, n);
    const double smooth_mass = s / static_cast<double>(vocab) *
                               (cw.defined() ? p.class_weight_sum : static_cast<double>(vocab));
    at::Tensor coef = w_y.defined() ? w_y * (1.0 - s) : at::full_like(lse_c, 1.0 - s);
    at::Tensor hit = coef * tok;  // (1 - s) w[y] scale, subtracted at the target
    coef.add_(smooth_mass);
    if (z > 0) coef.add_(lse_c, 2.0 * z);
    at::Tensor g = softmax.div_(row_sum);
    g.mul_((coef * tok).unsqueeze(1));
    g.scatter_add_(1, y_safe, hit.neg_().unsqueeze(1));
    if (s > 0) {
      if (cw.defined()) {
        g.addr_(tok, cw, 1.0, -s / static_cast<double>(vocab));
      } else {
        g.sub_((tok * (s / static_cast<double>(vocab))).unsqueeze(1));
      }
    }
    if (cap > 0) g.mul_(logits.div_(cap).square_().neg_().add_(1.0));
    logits = at::Tensor();  // free the block before the GEMMs
    if (wants.hidden) {
      const at::Tensor g_in =
          g.scalar_type() == p.weight.scalar_type() ? g : g.to(p.weight.scalar_type());
      at::Tensor rows = grads->hidden.narrow(0, start, n);
      at::mm_out(rows, g_in, p.weight);
    }
    if (wants.weight) {
      grads->weight.addmm_(g.t(), h.scalar_type() == p.acc ? h : h.to(p.acc));
    }
    if (wants.bias) grads->bias.add_(g.sum(0));
  }
}

Grads allocate_grads(const Problem& p, const Wants& wants) {
  Grads grads;
  const auto acc = p.hidden.options().dtype(p.acc);
  if (wants.hidden) grads.hidden = at::empty(p.hidden.sizes(), p.hidden.options());
  if (wants.weight) grads.weight = at::zeros(p.weight.sizes(), acc);
  if (wants.bias) grads.bias = at::zeros({p.weight.size(0)}, acc);
  return grads;
}

// The factor each token's gradient carries in forward: 1 / denominator for
// mean (sum of w[y] over non-ignored tokens), 1 for sum; 0 for ignored
// tokens, so that an all-ignored mean has zero (not NaN) gradients, as in
// PyTorch.
std::pair<at::Tensor, at::Tensor> scale_and_denominator(const Problem& p,
                                                        const LinearCrossEntropyConfig& config) {
  const at::Tensor kept = p.target.ne(config.ignore_index);
  at::Tensor denominator;
  if (p.class_weights.defined()) {
    const at::Tensor y_safe = p.target.masked_fill(kept.logical_not(), 0);
    denominator = p.class_weights.index_select(0, y_safe).mul_(kept).sum();
  } else {
    denominator = kept.sum().to(p.acc);
  }
  const at::Tensor per_token = config.reduction == LossReduction::mean
                                   ? denominator.reciprocal()
                                   : at::ones({}, denominator.options());
  return {at::where(kept, per_token, at::zeros({}, per_token.options())), denominator};
}

at::Tensor reduce(const at::Tensor& per_token, const at::Tensor& denominator,
                  LossReduction reduction) {
  switch (reduction) {
    case LossReduction::mean:
      return per_token.sum() / denominator;  // 0 / 0 = NaN when all ignored
    case LossReduction::sum:
      return per_token.sum();
    case LossReduction::none:
      break;
  }
  return per_token;
}

void save_config(AutogradContext* ctx, const LinearCrossEntropyConfig& config, const Wants& wants) {
  ctx->saved_data["reduction"] = static_cast<std::int64_t>(config.reduction);
  ctx->saved_data["ignore_index"] = config.ignore_index;
  ctx->saved_data["label_smoothing"] = config.label_smoothing;
  ctx->saved_data["z_loss"] = config.z_loss;
  ctx->saved_data["logit_softcap"] = config.logit_softcap;
  ctx->saved_data["chunk_size"] = config.chunk_size;
  ctx->saved_data["wants_hidden"] = wants.hidden;
  ctx->saved_data["wants_weight"] = wants.weight;
  ctx->saved_data["wants_bias"] = wants.bias;
}

LinearCrossEntropyConfig load_config(AutogradContext* ctx, Wants* wants) {
  LinearCrossEntropyConfig config;
  config.reduction = static_cast<LossReduction>(ctx->saved_data["reduction"].toInt());
  config.ignore_index = ctx->saved_data["ignore_index"].toInt();
  config.label_smoothing = ctx->saved_data["label_smoothing"].toDouble();
  config.z_loss = ctx->saved_data["z_loss"].toDouble();
  config.logit_softcap = ctx->saved_data["logit_softcap"].toDouble();
  config.chunk_size = ctx->saved_data["chunk_size"].toInt();
  wants->hidden = ctx->saved_data["wants_hidden"].toBool();
  wants->weight = ctx->saved_data["wants_weight"].toBool();
  wants->bias = ctx->saved_data["wants_bias"].toBool();
  return config;
}

at::Tensor take(AutogradContext* ctx, const std::string& key) {
  auto it = ctx->saved_data.find(key);
  if (it == ctx->saved_data.end()) return {};
  at::Tensor t = it->second.toTensor();
  ctx->saved_data.erase(it);
  return t;
}

class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  // Returns {loss, lse, per_token_loss}; the last two carry no gradient.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden,
                               const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                               const at::Tensor& target,
                               const std::optional<at::Tensor>& class_weights_or_none,
                               const LinearCrossEntropyConfig& config, const Wants& wants) {
    const at::Tensor b = bias.value_or(at::Tensor());
    const at::Tensor class_weights = class_weights_or_none.value_or(at::Tensor());
    const Problem p = make_problem(hidden, weight, b, target, class_weights);
    auto [scale, denominator] = scale_and_denominator(p, config);
    at::Tensor per_token = at::empty({hidden.size(0)}, hidden.options().dtype(p.acc));
    at::Tensor lse = at::empty_like(per_token);
    save_config(ctx, config, wants);
    ctx->saved_data["weight_dtype"] = static_cast<std::int64_t>(weight.scalar_type());
    if (config.reduction == LossReduction::none) {
      // The upstream gradient is per token and unknown yet: backward
      // recomputes the chunks with it.
      run_chunks(p, config, {}, &per_token, &lse, nullptr, wants);
      ctx->save_for_backward({hidden, weight, b, target, class_weights});
      at::Tensor loss = per_token.clone();
      ctx->mark_non_differentiable({lse, per_token});
      return {loss, lse, per_token};
    }
    Grads grads = allocate_grads(p, wants);
    run_chunks(p, config, scale, &per_token, &lse, &grads, wants);
    if (grads.hidden.defined()) ctx->saved_data["grad_hidden"] = grads.hidden;
    if (grads.weight.defined()) ctx->saved_data["grad_weight"] = grads.weight;
    if (grads.bias.defined()) ctx->saved_data["grad_bias"] = grads.bias;
    ctx->saved_data["consumed"] = false;
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
    Wants wants;
    const LinearCrossEntropyConfig config = load_config(ctx, &wants);
    const at::Tensor& upstream = grad_outputs[0];
    Grads grads;
    if (config.reduction == LossReduction::none) {
      const variable_list saved = ctx->get_saved_variables();
      const Problem p = make_problem(saved[0], saved[1], saved[2], saved[3], saved[4]);
      const at::Tensor kept = p.target.ne(config.ignore_index);
      const at::Tensor scale =
          at::where(kept, upstream.to(p.acc), at::zeros({}, upstream.options().dtype(p.acc)));
      grads = allocate_grads(p, wants);
      run_chunks(p, config, scale, nullptr, nullptr, &grads, wants);
    } else {
      TORCH_CHECK(!ctx->saved_data["consumed"].toBool(),
                  "keel::linear_cross_entropy: backward ran twice through one loss with "
                  "reduction mean or sum; keel hands its precomputed gradients to the first "
                  "backward (to save memory), so compute the loss again for a second one");
      ctx->saved_data["consumed"] = true;
      // The saved gradients are handed over and scaled in place: keeping a
      // copy would double the weight gradient's memory.
      grads.hidden = take(ctx, "grad_hidden");
      grads.weight = take(ctx, "grad_weight");
      grads.bias = take(ctx, "grad_bias");
      for (at::Tensor* t : {&grads.hidden, &grads.weight, &grads.bias}) {
        if (t->defined()) t->mul_(upstream);
      }
    }
    const auto& weight_dtype = ctx->saved_data["weight_dtype"];
    const auto dtype = static_cast<at::ScalarType>(weight_dtype.toInt());
    if (grads.weight.defined()) grads.weight = grads.weight.to(dtype);
    if (grads.bias.defined()) grads.bias = grads.bias.to(dtype);
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
  Wants wants;
  if (at::GradMode::is_enabled()) {
    wants.hidden = hidden.requires_grad();
    wants.weight = weight.requires_grad();
    wants.bias = bias.defined() && bias.requires_grad();
  }
  if (!wants.any()) {
    // No gradient is wanted: one pass, no gradient buffers, no autograd node.
    const Problem p = make_problem(hidden, weight, bias, target, class_weights);
    auto [scale, denominator] = scale_and_denominator(p, config);
    at::Tensor per_token = at::empty({hidden.size(0)}, hidden.options().dtype(p.acc));
    at::Tensor lse = at::empty_like(per_token);
    run_chunks(p, config, {}, &per_token, &lse, nullptr, wants);
    at::Tensor loss = reduce(per_token, denominator, config.reduction);
    if (config.reduction == LossReduction::none) loss = per_token.clone();
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

}  // namespace keel::compat
