#include "attention_mask.h"

#include <ATen/ATen.h>

namespace keel::kernels {

namespace {

at::TensorOptions index_options(const at::Device& device) {
  return at::TensorOptions().dtype(at::kLong).device(device);
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

at::Tensor as_rank4(const at::Tensor& t) {
  at::Tensor out = t;
  while (out.dim() < 4) out = out.unsqueeze(0);
  return out;
}

// One term over queries [q0, q0 + rows) and keys `keys`: bool, rank <= 4,
// broadcastable to [B, Hq, rows, keys.numel()].
at::Tensor tile_term(const Mask& m, const MaskGeometry& g, std::int64_t q0, std::int64_t rows,
                     const at::Tensor& keys) {
  const std::int64_t n = keys.numel();
  const at::Tensor kpos = keys.view({1, 1, 1, n});
  const auto positions = [&](CausalAlignment a) {
    return (at::arange(q0, q0 + rows, keys.options()) + query_offset(a, g)).view({1, 1, rows, 1});
  };
  switch (m.kind) {
    case MaskKind::causal:
      return kpos <= positions(m.alignment);
    case MaskKind::sliding_window: {
      const at::Tensor p = positions(m.alignment);
      return (kpos >= p - m.window_left) & (kpos <= p + m.window_right);
    }
    case MaskKind::chunked_causal: {
      const at::Tensor p = positions(m.alignment);
      return (kpos <= p) &
             (at::div(kpos, m.chunk_size, "floor") == at::div(p, m.chunk_size, "floor"));
    }
    case MaskKind::prefix_lm: {
      const at::Tensor prefix = m.prefix_lengths.to(at::kLong).view({g.batch, 1, 1, 1});
      return (kpos < prefix) | (kpos <= positions(m.alignment));
    }
    case MaskKind::document:
      return m.q_document_ids.to(at::kLong).narrow(1, q0, rows).view({g.batch, 1, rows, 1}) ==
             m.kv_document_ids.to(at::kLong).index_select(1, keys).view({g.batch, 1, 1, n});
    case MaskKind::key_padding:
      return (kpos < m.kv_lengths.to(at::kLong).view({g.batch, 1, 1, 1}))
          .expand({g.batch, 1, rows, n});
    case MaskKind::block: {
      const BlockMask& bm = m.block;
      const std::int64_t kv_blocks = block_count(g.kv_len, bm.kv_block_size);
      at::Tensor blocks = listed_blocks(bm.kv_num_blocks, bm.kv_indices, kv_blocks);
      if (bm.full_kv_num_blocks.defined()) {
        blocks = blocks | listed_blocks(bm.full_kv_num_blocks, bm.full_kv_indices, kv_blocks);
      }
      const at::Tensor qi =
          at::div(at::arange(q0, q0 + rows, keys.options()), bm.q_block_size, "floor");
      const at::Tensor ki = at::div(keys, bm.kv_block_size, "floor");
      return blocks.index_select(2, qi).index_select(3, ki);
    }
    case MaskKind::tensor: {
      at::Tensor t = as_rank4(m.tensor);
      if (t.size(2) != 1) t = t.narrow(2, q0, rows);
      if (t.size(3) != 1) t = t.index_select(3, keys);
      return t;
    }
  }
  return at::ones({1, 1, rows, n}, keys.options().dtype(at::kBool));
}

}  // namespace

std::int64_t query_offset(CausalAlignment alignment, const MaskGeometry& g) {
  return alignment == CausalAlignment::bottom_right ? g.kv_len - g.q_len : 0;
}

at::Tensor materialize_term(const Mask& m, const MaskGeometry& g, const at::Device& device) {
  return as_rank4(tile_term(m, g, 0, g.q_len, at::arange(g.kv_len, index_options(device))));
}

at::Tensor materialize_tile(const AttentionSpec& spec, const MaskGeometry& g, std::int64_t q0,
                            std::int64_t rows, const at::Tensor& keys) {
  at::Tensor mask;
  for (const Mask& m : spec.masks) {
    const at::Tensor term = as_rank4(tile_term(m, g, q0, rows, keys));
    if (!mask.defined()) {
      mask = term;
    } else {
      mask = spec.combine == MaskCombine::any_of ? (mask | term) : (mask & term);
    }
  }
  if (mask.defined() && (mask.size(2) != rows || mask.size(3) != keys.numel())) {
    mask = mask.expand({mask.size(0), mask.size(1), rows, keys.numel()});
  }
  return mask;
}

at::Tensor materialize_mask(const AttentionSpec& spec, const MaskGeometry& g,
                            const at::Device& device) {
  return materialize_tile(spec, g, 0, g.q_len, at::arange(g.kv_len, index_options(device)));
}

BlockClasses classify_blocks(const AttentionSpec& spec, const MaskGeometry& g,
                             const at::Device& device, std::int64_t q_block,
                             std::int64_t kv_block) {
  const std::int64_t q_blocks = block_count(g.q_len, q_block);
  const std::int64_t kv_blocks = block_count(g.kv_len, kv_block);
  const at::TensorOptions cpu = at::TensorOptions().dtype(at::kLong);
  // First and last query row, and key, of each block.
  const at::Tensor r0 = (at::arange(q_blocks, cpu) * q_block).view({q_blocks, 1});
  const at::Tensor r1 = at::clamp_max(r0 + q_block, g.q_len) - 1;
  const at::Tensor j0 = (at::arange(kv_blocks, cpu) * kv_block).view({1, kv_blocks});
  const at::Tensor j1 = at::clamp_max(j0 + kv_block, g.kv_len) - 1;
  // Far enough for "unbounded" without overflow.
  const std::int64_t unbounded = 4 * (g.q_len + g.kv_len) + 1;
  const auto band = [&](std::int64_t offset, std::int64_t left, std::int64_t right) {
    const at::Tensor p0 = r0 + offset;
    const at::Tensor p1 = r1 + offset;
    return BlockClasses{(j1 >= p0 - left) & (j0 <= p1 + right),
                        (j0 >= p1 - left) & (j1 <= p0 + right)};
  };
  BlockClasses out;
  for (const Mask& m : spec.masks) {
    BlockClasses term;
    const std::int64_t offset = query_offset(m.alignment, g);
    switch (m.kind) {
      case MaskKind::causal:
        term = band(offset, unbounded, 0);
        break;
      case MaskKind::sliding_window:
        term = band(offset, m.window_left, m.window_right);
        break;
      case MaskKind::chunked_causal: {
        // Visible at most where causal within one chunk length; full when
        // the whole block pair lies in one chunk and before the diagonal.
        term = band(offset, m.chunk_size - 1, 0);
        const at::Tensor lo = at::div(at::minimum(j0, r0 + offset), m.chunk_size, "floor");
        const at::Tensor hi = at::div(at::maximum(j1, r1 + offset), m.chunk_size, "floor");
        term.full = term.full & (lo == hi);
        break;
      }
      case MaskKind::prefix_lm: {
        // Causal, or a block wholly (partly) inside every (some) batch's prefix.
        term = band(offset, unbounded, 0);
        const at::Tensor prefix = m.prefix_lengths.to(at::kLong).cpu().view({-1, 1, 1});
        term.visible = term.visible | (j0 < prefix).any(0);
        term.full = term.full | (j1 < prefix).all(0);
        break;
      }
      case MaskKind::key_padding: {
        const at::Tensor lengths = m.kv_lengths.to(at::kLong).cpu().view({-1, 1, 1});
        term.visible = (j0 < lengths).any(0).expand({q_blocks, kv_blocks});
        term.full = (j1 < lengths).all(0).expand({q_blocks, kv_blocks});
        break;
      }
      case MaskKind::document: {
        // From each block's range of ids: blocks whose ranges do not overlap
        // share no document; a block pair holding one id only is full.
        const auto ranges = [](const at::Tensor& ids, std::int64_t block, std::int64_t blocks) {
          const std::int64_t len = ids.size(1);
          // Rows past the end repeat the last id, which leaves min and max as they are.
          const at::Tensor idx = at::clamp_max(at::arange(blocks * block, at::kLong), len - 1);
          const at::Tensor tiled =
              ids.to(at::kLong).cpu().index_select(1, idx).view({ids.size(0), blocks, block});
          return std::pair{tiled.amin(-1), tiled.amax(-1)};
        };
        const auto [qmin, qmax] = ranges(m.q_document_ids, q_block, q_blocks);
        const auto [kmin, kmax] = ranges(m.kv_document_ids, kv_block, kv_blocks);
        const at::Tensor q_lo = qmin.unsqueeze(2), q_hi = qmax.unsqueeze(2);
        const at::Tensor k_lo = kmin.unsqueeze(1), k_hi = kmax.unsqueeze(1);
        term.visible = ((q_lo <= k_hi) & (k_lo <= q_hi)).any(0);
        term.full = ((q_lo == q_hi) & (k_lo == k_hi) & (q_lo == k_lo)).all(0);
        break;
      }
      case MaskKind::block:
        if (m.block.q_block_size == q_block && m.block.kv_block_size == kv_block) {
          // A listed block is visible entirely: the lists are the classes,
          // up to the union (intersection) over batches and heads.
          at::Tensor listed =
              listed_blocks(m.block.kv_num_blocks.cpu(), m.block.kv_indices.cpu(), kv_blocks);
          if (m.block.full_kv_num_blocks.defined()) {
            listed = listed | listed_blocks(m.block.full_kv_num_blocks.cpu(),
                                            m.block.full_kv_indices.cpu(), kv_blocks);
          }
          const at::Tensor per_head = listed.flatten(0, 1);
          term.visible = per_head.any(0);
          term.full = per_head.all(0);
          break;
        }
        [[fallthrough]];
      default: {
        const at::Tensor t = materialize_term(m, g, device);
        const std::int64_t pad_q = q_blocks * q_block - g.q_len;
        const std::int64_t pad_k = kv_blocks * kv_block - g.kv_len;
        // Bool reductions over the tile dims, innermost (contiguous) first.
        // Padding is false for "any" and true for "all".
        const auto tiles = [&](bool pad_value) {
          const at::Tensor padded =
              pad_q == 0 && pad_k == 0
                  ? t
                  : at::constant_pad_nd(t, {0, pad_k, 0, pad_q}, pad_value ? 1.0 : 0.0);
          return padded.contiguous().view(
              {t.size(0), t.size(1), q_blocks, q_block, kv_blocks, kv_block});
        };
        term.visible = tiles(false).any(5).any(3).flatten(0, 1).any(0).cpu();
        term.full = tiles(true).all(5).all(3).flatten(0, 1).all(0).cpu();
        break;
      }
    }
    if (!out.visible.defined()) {
      out = term;
    } else if (spec.combine == MaskCombine::any_of) {
      out = {out.visible | term.visible, out.full | term.full};
    } else {
      out = {out.visible & term.visible, out.full & term.full};
    }
  }
  if (!out.visible.defined()) {
    out.visible = at::ones({q_blocks, kv_blocks}, at::kBool);
    out.full = out.visible;
  }
  return out;
}

}  // namespace keel::kernels
