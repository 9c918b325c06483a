// The passes of keel's fused linear cross-entropy over the token chunks
// (chunked_linear_cross_entropy.h): forward (the loss, and with whole rows
// the gradients from the same blocks), the recomputing gradient pass, and
// the reductions.
#pragma once

#include <utility>

#include <ATen/ATen.h>

#include "loss_chunk.h"

namespace keel::kernels::loss {

// One pass over the token chunks, whole rows or vocabulary blocks. Writes
// the per-token loss and lse when asked (non-null). When `grads` is
// non-null it adds each token's logit gradient times token_scale[i] (0 for
// ignored tokens) into the buffers; with whole rows that happens in the
// same pass, from the block's exponentials.
void forward_pass(const LossInputs& p, const LinearCrossEntropyConfig& config,
                  const at::Tensor& token_scale, at::Tensor* per_token, at::Tensor* lse,
                  Grads* grads, const GradientsWanted& wants);

// The gradient by recomputation, from the saved per-token lse: each block's
// logits again, their softmax exp(l - lse) in place, then the gradient.
void gradient_pass(const LossInputs& p, const LinearCrossEntropyConfig& config,
                   const at::Tensor& token_scale, const at::Tensor& lse, Grads* grads,
                   const GradientsWanted& wants);

Grads allocate_grads(const LossInputs& p, const GradientsWanted& wants);

// The factor each token's gradient carries: 1 / denominator for mean (sum
// of w[y] over non-ignored tokens), 1 for sum; 0 for ignored tokens, so
// that an all-ignored mean has zero (not NaN) gradients, as in PyTorch.
std::pair<at::Tensor, at::Tensor> scale_and_denominator(const LossInputs& p,
                                                        const LinearCrossEntropyConfig& config);

at::Tensor reduce(const at::Tensor& per_token, const at::Tensor& denominator, Reduction reduction);

}  // namespace keel::kernels::loss
