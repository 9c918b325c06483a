#include "chunked_linear_cross_entropy.h"

#include <algorithm>
#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "loss_chunk.h"
#include "loss_passes.h"

namespace keel::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The autograd function over the passes (loss_passes.h) and their per-chunk
// math (loss_chunk.h).
using loss::allocate_grads;
using loss::forward_pass;
using loss::gradient_pass;
using loss::GradientsWanted;
using loss::Grads;
using loss::LossInputs;
using loss::make_loss_inputs;
using loss::reduce;
using loss::scale_and_denominator;
using loss::TargetWeights;

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
