// The dense attention path: at::scaled_dot_product_attention (present since
// libtorch 2.0, so in 2.9 and 2.13 alike) for the calls it computes exactly.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "keel/v1/attention.h"

namespace keel::kernels {

// Empty when SDPA computes this call exactly (keel's semantics included);
// else why not, in a phrase.
std::string sdpa_refusal(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const AttentionSpec& spec);

// Only for calls sdpa_refusal() accepts.
at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionSpec& spec, double scale);

}  // namespace keel::kernels
