#include "attention_mask.h"

#include <ATen/ATen.h>

namespace keel::compat {

namespace {

at::TensorOptions index_options(const at::Device& device) {
  return at::TensorOptions().dtype(at::kLong).device(device);
}

// [1, 1, Lq, 1] query positions and [1, 1, 1, Lk] key positions.
at::Tensor query_positions(CausalAlignment alignment, const MaskGeometry& g,
                           const at::Device& device) {
  return (at::arange(g.q_len, index_options(device)) + query_offset(alignment, g))
      .view({1, 1, g.q_len, 1});
}

at::Tensor key_positions(const MaskGeometry& g, const at::Device& device) {
  return at::arange(g.kv_len, index_options(device)).view({1, 1, 1, g.kv_len});
}

// Which key blocks a block-mask pair lists: bool [B', H', Qb, KVb]. Slots past
// a row's count are sent to a spare column, which is dropped.
at::Tensor listed_blocks(const at::Tensor& counts, const at::Tensor& indices,
                         std::int64_t kv_blocks) {
  const at::Tensor idx = indices.to(at::kLong);
  const std::int64_t slots = idx.size(3);
  const at::Tensor used =
      at::arange(slots, idx.options()).view({1, 1, 1, slots}) < counts.to(at::kLong).unsqueeze(-1);
  const at::Tensor target = at::where(used, idx, at::full({}, kv_blocks, idx.options()));
  std::vector<std::int64_t> shape(idx.sizes().begin(), idx.sizes().end());
  shape[3] = kv_blocks + 1;
  at::Tensor listed = at::zeros(shape, idx.options().dtype(at::kBool));
  listed.scatter_(3, target, true);
  return listed.narrow(3, 0, kv_blocks);
}

at::Tensor block_term(const BlockMask& bm, const MaskGeometry& g, const at::Device& device) {
  const std::int64_t kv_blocks = (g.kv_len + bm.kv_block_size - 1) / bm.kv_block_size;
  at::Tensor blocks = listed_blocks(bm.kv_num_blocks, bm.kv_indices, kv_blocks);
  if (bm.full_kv_num_blocks.defined()) {
    blocks = blocks | listed_blocks(bm.full_kv_num_blocks, bm.full_kv_indices, kv_blocks);
  }
  const at::Tensor qi =
      at::div(at::arange(g.q_len, index_options(device)), bm.q_block_size, "floor");
  const at::Tensor ki =
      at::div(at::arange(g.kv_len, index_options(device)), bm.kv_block_size, "floor");
  return blocks.index_select(2, qi).index_select(3, ki);
}

at::Tensor as_rank4(const at::Tensor& t) {
  at::Tensor out = t;
  while (out.dim() < 4) out = out.unsqueeze(0);
  return out;
}

}  // namespace

std::int64_t query_offset(CausalAlignment alignment, const MaskGeometry& g) {
  return alignment == CausalAlignment::bottom_right ? g.kv_len - g.q_len : 0;
}

at::Tensor materialize_term(const Mask& m, const MaskGeometry& g, const at::Device& device) {
  const at::Tensor kpos = key_positions(g, device);
  switch (m.kind) {
    case MaskKind::causal:
      return kpos <= query_positions(m.alignment, g, device);
    case MaskKind::sliding_window: {
      const at::Tensor p = query_positions(m.alignment, g, device);
      return (kpos >= p - m.window_left) & (kpos <= p + m.window_right);
    }
    case MaskKind::chunked_causal: {
      const at::Tensor p = query_positions(m.alignment, g, device);
      return (kpos <= p) &
             (at::div(kpos, m.chunk_size, "floor") == at::div(p, m.chunk_size, "floor"));
    }
    case MaskKind::prefix_lm: {
      const at::Tensor prefix = m.prefix_lengths.to(at::kLong).view({g.batch, 1, 1, 1});
      return (kpos < prefix) | (kpos <= query_positions(m.alignment, g, device));
    }
    case MaskKind::document:
      return m.q_document_ids.to(at::kLong).view({g.batch, 1, g.q_len, 1}) ==
             m.kv_document_ids.to(at::kLong).view({g.batch, 1, 1, g.kv_len});
    case MaskKind::key_padding:
      return (kpos < m.kv_lengths.to(at::kLong).view({g.batch, 1, 1, 1}))
          .expand({g.batch, 1, g.q_len, g.kv_len});
    case MaskKind::block:
      return block_term(m.block, g, device);
    case MaskKind::tensor:
      return as_rank4(m.tensor);
  }
  return at::ones({1, 1, g.q_len, g.kv_len}, index_options(device).dtype(at::kBool));
}

at::Tensor materialize_mask(const AttentionSpec& spec, const MaskGeometry& g,
                            const at::Device& device) {
  at::Tensor mask;
  for (const Mask& m : spec.masks) {
    const at::Tensor term = materialize_term(m, g, device);
    if (!mask.defined()) {
      mask = term;
    } else {
      mask = spec.combine == MaskCombine::any_of ? (mask | term) : (mask & term);
    }
  }
  if (mask.defined() && (mask.size(2) != g.q_len || mask.size(3) != g.kv_len)) {
    mask = mask.expand({mask.size(0), mask.size(1), g.q_len, g.kv_len});
  }
  return mask;
}

}  // namespace keel::compat
