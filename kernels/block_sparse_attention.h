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

#include "keel/v1/attention.h"

namespace keel::kernels {

struct BlockSparseResult {
  at::Tensor out;  // [B, Hq, Lq, Ev], q's dtype
  at::Tensor lse;  // [B, Hq, Lq], float32 (float64 for float64 input)
  // Blocks multiplied / blocks of the dense problem, over (query, key) block pairs.
  double visible_fraction = 1.0;
  // Calls of libtorch's CPU flash kernel, or -1 when the tile loop on plain
  // ATen ops ran (score modifiers, another device, Ev != E).
  std::int64_t kernel_calls = -1;
};

// q, k, v and spec as keel::attention validated them; `scale` resolved.
BlockSparseResult block_sparse_attention(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const AttentionSpec& spec,
                                         double scale);

// ALiBi and bias for the scores of queries [q0, q0 + q_rows) against the keys
// `keys` (int64 positions), in the dtype of `scores`, added to it.
at::Tensor add_score_modifiers(const at::Tensor& scores, const AttentionSpec& spec, std::int64_t q0,
                               std::int64_t q_rows, const at::Tensor& keys, std::int64_t q_len,
                               std::int64_t kv_len);

}  // namespace keel::kernels
