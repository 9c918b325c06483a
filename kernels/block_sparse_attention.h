// keel's block-sparse attention. Queries are tiled into blocks; for each
// query block the key blocks are classified as empty (skipped), full (no
// masking) or partial (the element mask applies), from the mask spec itself,
// so the cost follows the fraction of visible blocks.
//
// On the CPU, without score modifiers, each contiguous range of visible key
// blocks is one call of libtorch's flash kernel
// (at::_scaled_dot_product_flash_attention_for_cpu, in 2.9 and 2.13 alike)
// over views of q, k and v; evenly spaced query blocks with the same range
// shape and mask are batched into one call; ranges that are not contiguous
// are merged by log-sum-exp. It is one autograd node whose backward calls the
// kernel's backward per call. Elsewhere a tile loop on plain ATen ops runs,
// differentiable through autograd.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "attention_result.h"
#include "keel/v1/attention.h"

namespace keel::kernels {

// q, k, v and spec as keel::attention validated them; `scale` resolved.
AttentionOutput block_sparse_attention(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const AttentionSpec& spec,
                                       double scale);

}  // namespace keel::kernels
