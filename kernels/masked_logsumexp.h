// keel's own log-sum-exp on long-stable ATen ops (present since 1.x): a
// boolean mask, float32 accumulation for half types, and rows with nothing
// to sum giving -inf with a zero gradient (at::logsumexp's gradient there
// is NaN).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace keel::kernels {

// `mask` is undefined or a bool tensor broadcastable to `input` (true keeps).
at::Tensor masked_logsumexp(const at::Tensor& input, const at::Tensor& mask, std::int64_t dim,
                            bool keepdim);

}  // namespace keel::kernels
