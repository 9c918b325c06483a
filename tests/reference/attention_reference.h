// The float64 reference for attention, on plain ATen ops and written
// independently of kernels/: the mask is materialised element by element
// (block masks by walking their index lists on the CPU), kv heads are
// repeated with repeat_interleave, and softmax(QK^T * scale + modifiers) V is
// computed over the whole [Lq, Lk] score matrix. Rows that see no key give
// output 0 and lse -inf.
#pragma once

#include <cstdint>
#include <limits>
#include <utility>

#include <ATen/ATen.h>
#include <keel/v1/attention.h>

namespace keel::reference {

inline std::int64_t position_offset(CausalAlignment a, std::int64_t q_len, std::int64_t kv_len) {
  return a == CausalAlignment::bottom_right ? kv_len - q_len : 0;
}

// Block mask as a bool [B, H, Qb, KVb], by walking kv_indices on the CPU.
inline at::Tensor reference_blocks(const BlockMask& bm, std::int64_t batch, std::int64_t heads,
                                   std::int64_t kv_blocks) {
  const std::int64_t qb = bm.kv_num_blocks.size(2);
  at::Tensor out = at::zeros({batch, heads, qb, kv_blocks}, at::kBool);
  auto o = out.accessor<bool, 4>();
  const auto fill = [&](const at::Tensor& counts_t, const at::Tensor& indices_t) {
    const at::Tensor counts = counts_t.cpu().to(at::kLong).contiguous();
    const at::Tensor indices = indices_t.cpu().to(at::kLong).contiguous();
    auto c = counts.accessor<std::int64_t, 3>();
    auto ix = indices.accessor<std::int64_t, 4>();
    for (std::int64_t b = 0; b < batch; ++b) {
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t cb = counts.size(0) == 1 ? 0 : b;
        const std::int64_t ch = counts.size(1) == 1 ? 0 : h;
        for (std::int64_t r = 0; r < qb; ++r) {
          for (std::int64_t s = 0; s < c[cb][ch][r]; ++s) o[b][h][r][ix[cb][ch][r][s]] = true;
        }
      }
    }
  };
  fill(bm.kv_num_blocks, bm.kv_indices);
  if (bm.full_kv_num_blocks.defined()) fill(bm.full_kv_num_blocks, bm.full_kv_indices);
  return out;
}

// One term, expanded to bool [B, H, Lq, Lk] on the CPU.
inline at::Tensor reference_term(const Mask& m, std::int64_t B, std::int64_t H, std::int64_t Lq,
                                 std::int64_t Lk) {
  const at::Tensor i = at::arange(Lq, at::kLong).view({1, 1, Lq, 1});
  const at::Tensor j = at::arange(Lk, at::kLong).view({1, 1, 1, Lk});
  const at::Tensor p = i + position_offset(m.alignment, Lq, Lk);
  at::Tensor t;
  switch (m.kind) {
    case MaskKind::causal:
      t = j.le(p);
      break;
    case MaskKind::sliding_window:
      t = (p - j).le(m.window_left) & (j - p).le(m.window_right);
      break;
    case MaskKind::chunked_causal: {
      // Floor division written out, since p may be negative.
      const at::Tensor pc = (p - p.remainder(m.chunk_size)) / m.chunk_size;
      const at::Tensor jc = (j - j.remainder(m.chunk_size)) / m.chunk_size;
      t = j.le(p) & pc.eq(jc);
      break;
    }
    case MaskKind::prefix_lm:
      t = j.lt(m.prefix_lengths.cpu().to(at::kLong).view({B, 1, 1, 1})) | j.le(p);
      break;
    case MaskKind::document:
      t = m.q_document_ids.cpu()
              .to(at::kLong)
              .view({B, 1, Lq, 1})
              .eq(m.kv_document_ids.cpu().to(at::kLong).view({B, 1, 1, Lk}));
      break;
    case MaskKind::key_padding:
      t = j.lt(m.kv_lengths.cpu().to(at::kLong).view({B, 1, 1, 1}));
      break;
    case MaskKind::block: {
      const std::int64_t kvb = (Lk + m.block.kv_block_size - 1) / m.block.kv_block_size;
      const at::Tensor blocks = reference_blocks(m.block, B, H, kvb);
      const at::Tensor qi = at::arange(Lq, at::kLong).floor_divide(m.block.q_block_size);
      const at::Tensor ki = at::arange(Lk, at::kLong).floor_divide(m.block.kv_block_size);
      t = blocks.index(
          {at::indexing::Slice(), at::indexing::Slice(), qi.view({Lq, 1}), ki.view({1, Lk})});
      break;
    }
    case MaskKind::tensor:
      t = m.tensor.cpu();
      break;
  }
  return t.expand({B, H, Lq, Lk}).contiguous();
}

inline at::Tensor attention_mask(const AttentionSpec& spec, std::int64_t B, std::int64_t H,
                                 std::int64_t Lq, std::int64_t Lk) {
  at::Tensor keep = at::ones({B, H, Lq, Lk}, at::kBool);
  for (std::size_t n = 0; n < spec.masks.size(); ++n) {
    const at::Tensor t = reference_term(spec.masks[n], B, H, Lq, Lk);
    if (n == 0) {
      keep = t;
    } else {
      keep = spec.combine == MaskCombine::all_of ? keep.logical_and(t) : keep.logical_or(t);
    }
  }
  return keep;
}

// The scores softmax reads, computed in `dtype`: scale * QK^T with every
// score modifier, -inf where the mask hides a key; kv heads repeated for
// their query group. [B, Hq, Lq, Lk], differentiable in q, k and spec.bias.
inline at::Tensor scores(const at::Tensor& q, const at::Tensor& k, const AttentionSpec& spec,
                         at::ScalarType dtype = at::kDouble) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), Lk = k.size(2);
  const std::int64_t group = H / k.size(1);
  const at::Tensor qd = q.to(dtype);
  const at::Tensor kd = k.to(dtype).repeat_interleave(group, 1);
  const double scale = spec.scale > 0 ? spec.scale : 1.0 / std::sqrt(double(q.size(3)));
  at::Tensor s = qd.matmul(kd.transpose(2, 3)) * scale;
  if (spec.softcap > 0) s = spec.softcap * (s / spec.softcap).tanh();
  if (spec.alibi_slopes.defined()) {
    const at::Tensor i =
        at::arange(Lq, at::kLong).view({Lq, 1}) + position_offset(spec.alibi_alignment, Lq, Lk);
    const at::Tensor j = at::arange(Lk, at::kLong).view({1, Lk});
    s = s + spec.alibi_slopes.to(dtype).view({H, 1, 1}) * (j - i).to(dtype);
  }
  if (spec.bias.defined()) s = s + spec.bias.to(dtype);
  const at::Tensor keep = attention_mask(spec, B, H, Lq, Lk).to(q.device());
  return s.masked_fill(keep.logical_not(), -inf);
}

// Attention computed in `dtype` (float64 for the reference; the input's own
// dtype for the "same-precision naive implementation" of the tolerance rule).
// Differentiable with respect to q, k, v and spec.bias. Returns out and lse.
inline std::pair<at::Tensor, at::Tensor> attention(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const AttentionSpec& spec,
                                                   at::ScalarType dtype = at::kDouble) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::int64_t group = q.size(1) / k.size(1);
  const at::Tensor vd = v.to(dtype).repeat_interleave(group, 1);
  const at::Tensor s = scores(q, k, spec, dtype);
  at::Tensor m = s.detach().amax(-1, true);
  m = m.masked_fill(m.isinf(), 0);
  const at::Tensor e = (s - m).exp();
  const at::Tensor l = e.sum(-1, true);
  const at::Tensor empty = l.eq(0);
  const at::Tensor l_safe = l.masked_fill(empty, 1);
  const at::Tensor out = e.matmul(vd) / l_safe;
  const at::Tensor lse = (l_safe.log() + m).masked_fill(empty, -inf).squeeze(-1);
  return {out, lse};
}

}  // namespace keel::reference
