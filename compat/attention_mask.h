// keel's attention mask materialiser on plain ATen ops: turns the mask terms
// of an AttentionSpec into one boolean tensor (true keeps). It is the dense
// path's mask and the element mask of the block-sparse kernel's partial
// blocks.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "keel/v1/attention.h"

namespace keel::compat {

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

}  // namespace keel::compat
