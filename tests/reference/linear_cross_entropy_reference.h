// The float64 reference for linear_cross_entropy, on plain ATen ops and
// written from the definition, independently of kernels/: the full [N, V]
// logits, their log-softmax, and PyTorch's cross-entropy formula with class
// weights and label smoothing spelt out (aten/src/ATen/native/LossNLL.cpp:
// (1 - s) * nll_loss + (s / V) * smooth_loss, where smooth_loss for a token
// is -sum_c w[c] log p[c] and mean divides both by the sum of w[y] over the
// non-ignored targets). It is differentiable, so autograd on it gives the
// reference gradients.
#pragma once

#include <cstdint>

#include <ATen/ATen.h>
#include <keel/keel.h>

namespace keel::reference {

struct LinearCrossEntropyCase {
  Reduction reduction = Reduction::mean;
  std::int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  at::Tensor class_weights;  // [V] or undefined
  at::Tensor bias;           // [V] or undefined
  double z_loss = 0.0;
  double logit_softcap = 0.0;
};

// Every tensor is converted to `compute` (float64: the reference; the
// input's own dtype: the naive computation a user would write, whose error
// bounds keel's); pass leaves of that dtype requiring grad to differentiate.
// Returns {loss, per-token loss [N], lse [N]}.
struct LinearCrossEntropyReference {
  at::Tensor loss;
  at::Tensor per_token;
  at::Tensor lse;
};

inline LinearCrossEntropyReference linear_cross_entropy(const at::Tensor& hidden,
                                                        const at::Tensor& weight,
                                                        const at::Tensor& target,
                                                        const LinearCrossEntropyCase& c,
                                                        at::ScalarType compute = at::kDouble) {
  const auto d = [compute](const at::Tensor& t) {
    return t.defined() ? t.to(compute) : at::Tensor();
  };
  const at::Tensor h = d(hidden).reshape({-1, hidden.size(-1)});
  const at::Tensor y = target.reshape({-1});
  const std::int64_t vocab = weight.size(0);
  at::Tensor logits = at::linear(h, d(weight), d(c.bias));
  if (c.logit_softcap > 0) logits = at::tanh(logits / c.logit_softcap) * c.logit_softcap;
  const at::Tensor logp = at::log_softmax(logits, 1);
  const at::Tensor lse = at::logsumexp(logits, 1);
  const at::Tensor kept = y != c.ignore_index;
  const at::Tensor y_safe = at::where(kept, y, at::zeros_like(y));
  const at::Tensor w =
      c.class_weights.defined() ? d(c.class_weights) : at::ones({vocab}, h.options());
  const at::Tensor w_y = w.index_select(0, y_safe);
  const at::Tensor nll = -logp.gather(1, y_safe.unsqueeze(1)).squeeze(1) * w_y;
  const at::Tensor smooth = -(logp * w.unsqueeze(0)).sum(1);
  at::Tensor per_token = nll * (1.0 - c.label_smoothing) +
                         smooth * (c.label_smoothing / static_cast<double>(vocab)) +
                         lse.square() * c.z_loss;
  per_token = at::where(kept, per_token, at::zeros_like(per_token));
  at::Tensor loss;
  switch (c.reduction) {
    case Reduction::mean:
      loss = per_token.sum() / (w_y * kept.to(compute)).sum();
      break;
    case Reduction::sum:
      loss = per_token.sum();
      break;
    case Reduction::none:
      loss = per_token.reshape(target.sizes());
      break;
  }
  return {loss, per_token, lse.detach()};
}

}  // namespace keel::reference
