// The reductions of the C ABI (keel.h, "logsumexp" and "loss"): masked
// log-sum-exp and the fused linear cross-entropy, forward and
// forward+backward, also vocabulary-parallel.
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "common.h"

namespace keel::c_api {
namespace {

result<LinearCrossEntropyOptions> loss_options_of(const KEEL_LinearCrossEntropy_Options* c_options,
                                                  Inputs& in) {
  LinearCrossEntropyOptions o;
  if (c_options == nullptr) return o;
  result<KEEL_LinearCrossEntropy_Options> s = sized(c_options, "options");
  if (!s) return s.error();
  const KEEL_LinearCrossEntropy_Options& c = s.value();
  if (c.reduction < KEEL_REDUCTION_MEAN || c.reduction > KEEL_REDUCTION_NONE) {
    return Error(Errc::invalid_argument,
                 "options.reduction is " + std::to_string(c.reduction) + ", not a KEEL_Reduction");
  }
  o.reduction = static_cast<Reduction>(c.reduction);
  if (c.has_ignore_index != 0) o.ignore_index = c.ignore_index;
  o.label_smoothing = c.label_smoothing;
  result<at::Tensor> weights = in.take(c.class_weights, "options.class_weights", true);
  if (!weights) return weights.error();
  o.class_weights = weights.value();
  o.z_loss = c.z_loss;
  o.logit_softcap = c.logit_softcap;
  result<at::Tensor> bias = in.take(c.bias, "options.bias", true);
  if (!bias) return bias.error();
  o.bias = bias.value();
  o.chunk_size = c.chunk_size;
  o.vocab_chunk_size = c.vocab_chunk_size;
  o.chunk_budget_bytes = c.chunk_budget_bytes;
  o.return_per_token_loss = c.return_per_token_loss != 0;
  o.return_lse = c.return_lse != 0;
  result<Backend> b = backend_of(c.backend, "options.backend");
  if (!b) return b.error();
  o.dispatch.backend = b.value();
  if (c.communicator != nullptr) {
    o.vocab_parallel.communicator = c.communicator->comm;
    o.vocab_parallel.vocab_start = c.vocab_start;
  }
  return o;
}

}  // namespace

KEEL_Error* logsumexp_call(KEEL_Logsumexp_Args* args) noexcept {
  return guarded("KEEL_Logsumexp", [&]() -> KEEL_Error* {
    using A = KEEL_Logsumexp_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::value, &A::served_backend);
    Inputs in;
    KEEL_TRY(input, in.take(a.input, "input"));
    KEEL_TRY(mask, in.take(a.mask, "mask", true));
    KEEL_TRY(backend, backend_of(a.backend, "backend"));
    LogsumexpOptions o;
    o.dim = a.dim;
    o.keepdim = a.keepdim != 0;
    o.mask = mask;
    o.dispatch.backend = backend;
    KEEL_TRY(r, logsumexp(input, o));
    out.tensor(&A::value, in.give(r.value));
    out.set(&A::served_backend, served(r.dispatch));
    return out.commit();
  });
}

KEEL_Error* loss_forward(KEEL_LinearCrossEntropy_Forward_Args* args) noexcept {
  return guarded("KEEL_LinearCrossEntropy_Forward", [&]() -> KEEL_Error* {
    using A = KEEL_LinearCrossEntropy_Forward_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::loss, &A::per_token_loss, &A::lse, &A::served_backend);
    Inputs in;
    KEEL_TRY(hidden, in.take(a.hidden, "hidden"));
    KEEL_TRY(weight, in.take(a.weight, "weight"));
    KEEL_TRY(target, in.take(a.target, "target"));
    KEEL_TRY(o, loss_options_of(a.options, in));
    c10::NoGradGuard no_grad;
    KEEL_TRY(r, linear_cross_entropy(hidden, weight, target, o));
    out.tensor(&A::loss, in.give(r.loss));
    out.tensor(&A::per_token_loss, in.give(r.per_token_loss));
    out.tensor(&A::lse, in.give(r.lse));
    out.set(&A::served_backend, served(r.dispatch));
    return out.commit();
  });
}

KEEL_Error* loss_forward_backward(KEEL_LinearCrossEntropy_ForwardBackward_Args* args) noexcept {
  return guarded("KEEL_LinearCrossEntropy_ForwardBackward", [&]() -> KEEL_Error* {
    using A = KEEL_LinearCrossEntropy_ForwardBackward_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::loss, &A::per_token_loss, &A::lse, &A::dhidden, &A::dweight, &A::dbias,
                   &A::served_backend);
    Inputs in;
    KEEL_TRY(hidden, in.take(a.hidden, "hidden"));
    KEEL_TRY(weight, in.take(a.weight, "weight"));
    KEEL_TRY(target, in.take(a.target, "target"));
    KEEL_TRY(dloss, in.take(a.dloss, "dloss", true));
    KEEL_TRY(o, loss_options_of(a.options, in));
    c10::AutoGradMode grad_mode(true);
    const at::Tensor hg = hidden.detach().requires_grad_(true);
    const at::Tensor wg = weight.detach().requires_grad_(true);
    at::Tensor bias;
    if (o.bias.defined()) {
      bias = o.bias.detach().requires_grad_(true);
      o.bias = bias;
    }
    KEEL_TRY(r, linear_cross_entropy(hg, wg, target, o));
    if (dloss.defined() && !dloss.sizes().equals(r.loss.sizes())) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "dloss must have loss's shape [" +
                                                        c10::str(r.loss.sizes()) + "], got [" +
                                                        c10::str(dloss.sizes()) + "]");
    }
    r.loss.backward(dloss.defined() ? dloss.to(r.loss.scalar_type()) : at::ones_like(r.loss));
    const auto grad = [](const at::Tensor& t) {
      return t.grad().defined() ? t.grad() : at::zeros_like(t);
    };
    out.tensor(&A::loss, in.give(r.loss));
    out.tensor(&A::per_token_loss, in.give(r.per_token_loss));
    out.tensor(&A::lse, in.give(r.lse));
    out.tensor(&A::dhidden, in.give(grad(hg)));
    out.tensor(&A::dweight, in.give(grad(wg)));
    if (bias.defined()) out.tensor(&A::dbias, in.give(grad(bias)));
    out.set(&A::served_backend, served(r.dispatch));
    return out.commit();
  });
}

}  // namespace keel::c_api
