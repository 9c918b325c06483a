#include "block_sparse_attention.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <ATen/ATen.h>

#include "attention_mask.h"

namespace keel::compat {

namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
constexpr std::int64_t kDefaultBlock = 128;

// Query i and key j of head h read kv head h / (Hq / Hkv): repeat each kv
// head for its group of query heads.
at::Tensor expand_heads(const at::Tensor& t, std::int64_t q_heads) {
  const std::int64_t kv_heads = t.size(1);
  if (kv_heads == q_heads) return t;
  const std::int64_t group = q_heads / kv_heads;
  return t.unsqueeze(2)
      .expand({t.size(0), kv_heads, group, t.size(2), t.size(3)})
      .reshape({t.size(0), q_heads, t.size(2), t.size(3)});
}

// The block sizes: those of the first block-mask term, else 128.
std::pair<std::int64_t, std::int64_t> block_sizes(const AttentionSpec& spec) {
  for (const Mask& m : spec.masks) {
    if (m.kind == MaskKind::block) return {m.block.q_block_size, m.block.kv_block_size};
  }
  return {kDefaultBlock, kDefaultBlock};
}

// Softmax over the last dim with a fully masked row (all -inf) giving 0
// output weights and lse -inf, and a zero gradient there.
struct RowSoftmax {
  at::Tensor weights_unnormalised;  // exp(s - shift)
  at::Tensor denominator;           // sum, 1 where the row is empty
  at::Tensor lse;                   // [..., 1]
};

RowSoftmax row_softmax(const at::Tensor& s) {
  // The shift by the row maximum keeps exp() from overflowing and carries
  // no gradient; an empty row is shifted by 0, not by -inf (which gives NaN).
  at::Tensor shift = std::get<0>(s.detach().max(-1, /*keepdim=*/true));
  shift = at::where(shift.isfinite(), shift, at::zeros_like(shift));
  const at::Tensor e = (s - shift).exp();
  const at::Tensor sum = e.sum(-1, /*keepdim=*/true);
  const at::Tensor empty = sum == 0;
  const at::Tensor safe = at::where(empty, at::ones_like(sum), sum);
  const at::Tensor lse =
      at::where(empty, at::full({}, kMinusInf, sum.options()), safe.log() + shift);
  return {e, safe, lse};
}

// 0, as a function of every differentiable input (so that backward reaches
// each of them with a zero gradient when no key is visible at all).
at::Tensor zero_tied_to_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const AttentionSpec& spec) {
  at::Tensor sum = q.sum() + k.sum() + v.sum();
  if (spec.bias.defined()) sum = sum + spec.bias.sum().to(sum.scalar_type());
  return sum * 0;
}

}  // namespace

at::Tensor add_score_modifiers(const at::Tensor& scores, const AttentionSpec& spec, std::int64_t q0,
                               std::int64_t q_rows, const at::Tensor& keys, std::int64_t q_len,
                               std::int64_t kv_len) {
  at::Tensor s = scores;
  if (spec.alibi_slopes.defined()) {
    const std::int64_t offset =
        spec.alibi_alignment == CausalAlignment::bottom_right ? kv_len - q_len : 0;
    const at::Tensor p =
        at::arange(q0, q0 + q_rows, keys.options()).add(offset).view({1, 1, q_rows, 1});
    const at::Tensor distance = (keys.view({1, 1, 1, -1}) - p).to(s.scalar_type());
    s = s + spec.alibi_slopes.to(s.scalar_type()).view({1, -1, 1, 1}) * distance;
  }
  if (spec.bias.defined()) {
    at::Tensor b = spec.bias;
    while (b.dim() < 4) b = b.unsqueeze(0);
    if (b.size(2) != 1) b = b.narrow(2, q0, q_rows);
    if (b.size(3) != 1) b = b.index_select(3, keys);
    s = s + b.to(s.scalar_type());
  }
  return s;
}

BlockSparseResult block_sparse_attention(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const AttentionSpec& spec,
                                         double scale) {
  const at::ScalarType acc = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const std::int64_t batch = q.size(0);
  const std::int64_t q_heads = q.size(1);
  const std::int64_t q_len = q.size(2);
  const std::int64_t kv_len = k.size(2);
  const std::int64_t value_dim = v.size(3);
  const at::TensorOptions acc_options = q.options().dtype(acc);

  BlockSparseResult result;
  if (q_len == 0 || kv_len == 0) {
    // No keys: every row is fully masked. Multiplying by q keeps the output
    // on the graph, so that backward gives zero gradients, not an error.
    const at::Tensor zero = zero_tied_to_inputs(q.to(acc), k.to(acc), v.to(acc), spec);
    result.out =
        (at::zeros({batch, q_heads, q_len, value_dim}, acc_options) + zero).to(q.scalar_type());
    result.lse = at::full({batch, q_heads, q_len}, kMinusInf, acc_options);
    result.visible_fraction = 0.0;
    return result;
  }

  // The scale is folded into q: [Lq, E] multiplications instead of [Lq, Lk].
  const at::Tensor qf = q.to(acc) * scale;
  const at::Tensor kf = expand_heads(k.to(acc), q_heads);
  const at::Tensor vf = expand_heads(v.to(acc), q_heads);

  const MaskGeometry geometry{batch, q_heads, q_len, kv_len};
  const auto [bq, bk] = block_sizes(spec);
  const std::int64_t q_blocks = (q_len + bq - 1) / bq;
  const std::int64_t kv_blocks = (kv_len + bk - 1) / bk;

  // Classify (query block, key block) pairs over every batch and head at
  // once: a key block is skipped when no (b, h) sees any of it, and needs no
  // masking when every (b, h) sees all of it.
  const BlockClasses classes = classify_blocks(spec, geometry, q.device(), bq, bk);
  const at::Tensor& visible = classes.visible;
  const at::Tensor& full = classes.full;
  const auto visible_a = visible.accessor<bool, 2>();
  const auto full_a = full.accessor<bool, 2>();

  std::vector<at::Tensor> outs;
  std::vector<at::Tensor> lses;
  outs.reserve(static_cast<std::size_t>(q_blocks));
  lses.reserve(static_cast<std::size_t>(q_blocks));
  std::int64_t multiplied = 0;
  // Skipped query blocks are 0, tied to the inputs by a zero multiple, so
  // that backward reaches q, k and v even when every block is skipped.
  at::Tensor anchor;
  const at::TensorOptions index = q.options().dtype(at::kLong);
  for (std::int64_t qb = 0; qb < q_blocks; ++qb) {
    const std::int64_t q0 = qb * bq;
    const std::int64_t rows = std::min(bq, q_len - q0);
    std::vector<std::int64_t> blocks;
    blocks.reserve(static_cast<std::size_t>(kv_blocks));
    bool needs_mask = false;
    for (std::int64_t kb = 0; kb < kv_blocks; ++kb) {
      if (!visible_a[qb][kb]) continue;
      blocks.push_back(kb);
      needs_mask = needs_mask || !full_a[qb][kb];
    }
    if (blocks.empty()) {
      if (!anchor.defined()) anchor = zero_tied_to_inputs(qf, kf, vf, spec);
      outs.push_back(at::zeros({batch, q_heads, rows, value_dim}, acc_options) + anchor);
      lses.push_back(at::full({batch, q_heads, rows, 1}, kMinusInf, acc_options));
      continue;
    }
    multiplied += static_cast<std::int64_t>(blocks.size());
    // A contiguous run of key blocks is a view; scattered blocks are gathered.
    const std::int64_t k0 = blocks.front() * bk;
    const std::int64_t k1 = std::min(kv_len, (blocks.back() + 1) * bk);
    const bool contiguous =
        blocks.back() - blocks.front() + 1 == static_cast<std::int64_t>(blocks.size());
    at::Tensor keys;
    if (contiguous) {
      keys = at::arange(k0, k1, index);
    } else {
      std::vector<at::Tensor> parts;
      parts.reserve(blocks.size());
      for (std::int64_t kb : blocks) {
        parts.push_back(at::arange(kb * bk, std::min(kv_len, (kb + 1) * bk), index));
      }
      keys = at::cat(parts);
    }
    const at::Tensor kt = contiguous ? kf.narrow(2, k0, k1 - k0) : kf.index_select(2, keys);
    const at::Tensor vt = contiguous ? vf.narrow(2, k0, k1 - k0) : vf.index_select(2, keys);
    const at::Tensor qt = qf.narrow(2, q0, rows);

    at::Tensor s = at::matmul(qt, kt.transpose(-2, -1));
    if (spec.softcap > 0) s = (s / spec.softcap).tanh() * spec.softcap;
    s = add_score_modifiers(s, spec, q0, rows, keys, q_len, kv_len);
    if (needs_mask) {
      s = s.masked_fill(materialize_tile(spec, geometry, q0, rows, keys).logical_not(), kMinusInf);
    }
    const RowSoftmax p = row_softmax(s);
    outs.push_back(at::matmul(p.weights_unnormalised, vt) / p.denominator);
    lses.push_back(p.lse);
  }
  result.out = at::cat(outs, 2).to(q.scalar_type());
  result.lse = at::cat(lses, 2).squeeze(-1);
  result.visible_fraction =
      static_cast<double>(multiplied) / static_cast<double>(q_blocks * kv_blocks);
  return result;
}

}  // namespace keel::compat
