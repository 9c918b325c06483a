// keel's attention mask materialiser on plain ATen ops: turns the mask terms
// of an AttentionSpec into one boolean tensor (true keeps). It is the dense
// path's mask and the element mask of the block-sparse kernel's partial
// blocks.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "keel/v1/attention.h"

namespace keel::kernels {

// ceil(length / block) for length >= 0 and block > 0, without the overflow
// of (length + block - 1) / block when block is huge (a caller's BlockMask
// may say INT64_MAX).
inline std::int64_t block_count(std::int64_t length, std::int64_t block) {
  return length / block + (length % block != 0 ? 1 : 0);
}

// The attention's sizes the mask is laid over.
struct MaskGeometry {
  std::int64_t batch = 1;
  std::int64_t q_heads = 1;
  std::int64_t q_len = 0;
  std::int64_t kv_len = 0;
};

// Query i's position under `alignment`: i, or i + Lk - Lq.
std::int64_t query_offset(CausalAlignment alignment, const MaskGeometry& g);

// One term as a bool tensor [B or 1, Hq or 1, Lq, Lk] on `device`.
at::Tensor materialize_term(const Mask& mask, const MaskGeometry& g, const at::Device& device);

// The terms of `spec.masks` combined by `spec.combine`, as a bool tensor
// [B or 1, Hq or 1, Lq, Lk]; undefined when there are no terms.
at::Tensor materialize_mask(const AttentionSpec& spec, const MaskGeometry& g,
                            const at::Device& device);

// The same mask over queries [q0, q0 + rows) and the keys at the int64
// positions `keys` (on the device): bool [B or 1, Hq or 1, rows, keys.numel()].
at::Tensor materialize_tile(const AttentionSpec& spec, const MaskGeometry& g, std::int64_t q0,
                            std::int64_t rows, const at::Tensor& keys);

// Which (query block, key block) pairs any (b, h) may see (`visible`, an
// over-approximation: a block marked visible may still be empty) and which
// every (b, h) sees entirely (`full`, exact or an under-approximation).
// Position masks (causal, windows, chunks) are classified from block corners,
// documents from each block's range of ids, key padding and prefixes from
// their lengths, a block mask of the same block sizes from its lists: none
// materialises an Lq x Lk mask. A tensor mask (or a block mask of other
// block sizes) is materialised and reduced. Both are bool [Qb, KVb] on the
// CPU.
struct BlockClasses {
  at::Tensor visible;
  at::Tensor full;
};
BlockClasses classify_blocks(const AttentionSpec& spec, const MaskGeometry& g,
                             const at::Device& device, std::int64_t q_block, std::int64_t kv_block);

}  // namespace keel::kernels
