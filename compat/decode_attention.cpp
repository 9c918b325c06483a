#include "decode_attention.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "attention_mask.h"
#include "row_softmax.h"

namespace keel::compat {

namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
// The granularity of the visible key range: key blocks of this many keys are
// classified from the mask spec, and the range read is the hull of the
// visible ones.
constexpr std::int64_t kKeyBlock = 256;
// Elements of a narrow (16-bit) cache converted to the compute dtype at a
// time: the only copy of the cache there is, a bounded one (1 MiB of
// float32, so that the product reads it from the cache, not from memory).
constexpr std::int64_t kConvertElements = std::int64_t{256} * 1024;

// `t` narrowed to batch b when its leading dim is the batch (of size B > 1);
// a tensor that broadcasts over the batch is kept whole.
void narrow_batch(at::Tensor& t, std::int64_t b, std::int64_t batch, std::int64_t batch_dim_rank) {
  if (batch > 1 && t.defined() && t.dim() == batch_dim_rank && t.size(0) == batch) {
    t = t.narrow(0, b, 1);
  }
}

// The spec as it applies to batch b alone.
AttentionSpec batch_slice(const AttentionSpec& spec, std::int64_t b, std::int64_t batch) {
  AttentionSpec s = spec;
  for (Mask& m : s.masks) {
    narrow_batch(m.prefix_lengths, b, batch, 1);
    narrow_batch(m.kv_lengths, b, batch, 1);
    narrow_batch(m.q_document_ids, b, batch, 2);
    narrow_batch(m.kv_document_ids, b, batch, 2);
    narrow_batch(m.tensor, b, batch, 4);
    narrow_batch(m.block.kv_num_blocks, b, batch, 3);
    narrow_batch(m.block.kv_indices, b, batch, 4);
    narrow_batch(m.block.full_kv_num_blocks, b, batch, 3);
    narrow_batch(m.block.full_kv_indices, b, batch, 4);
  }
  narrow_batch(s.bias, b, batch, 4);
  return s;
}

// The keys [lo, hi) that some query of the sequence may see, and whether
// every query sees all of them.
struct KeyRange {
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  bool full = false;
};

// The range from the mask spec's own arithmetic, for terms whose visible keys
// are an interval per query (causal, sliding window, key padding) combined
// with all_of: exact, so that a single query (Lq = 1) never needs a mask.
// Empty (no value) when another term or any_of needs the block classifier.
std::optional<KeyRange> interval_range(const AttentionSpec& spec, const MaskGeometry& g) {
  if (spec.combine != MaskCombine::all_of && spec.masks.size() > 1) return std::nullopt;
  KeyRange r{0, g.kv_len, true};
  for (const Mask& m : spec.masks) {
    const std::int64_t p0 = query_offset(m.alignment, g);  // first query's position
    const std::int64_t p1 = p0 + g.q_len - 1;              // last query's position
    switch (m.kind) {
      case MaskKind::causal:
        r.hi = std::min(r.hi, p1 + 1);
        r.full = r.full && g.q_len == 1;
        break;
      case MaskKind::sliding_window:
        // The core saturates the window to Lq + Lk: no overflow here.
        r.lo = std::max(r.lo, p0 - m.window_left);
        r.hi = std::min(r.hi, p1 + m.window_right + 1);
        r.full = r.full && g.q_len == 1;
        break;
      case MaskKind::key_padding:
        r.hi = std::min(r.hi, m.kv_lengths.item<std::int64_t>());
        break;
      default:
        return std::nullopt;
    }
  }
  if (r.hi <= r.lo) return KeyRange{};
  return r;
}

// The hull of the visible key blocks, from the block classifier.
KeyRange classified_range(const AttentionSpec& spec, const MaskGeometry& g) {
  const BlockClasses c = classify_blocks(spec, g, at::kCPU, g.q_len, kKeyBlock);
  const auto visible = c.visible.accessor<bool, 2>();
  const auto full = c.full.accessor<bool, 2>();
  const std::int64_t blocks = c.visible.size(1);
  std::int64_t first = -1;
  std::int64_t last = -1;
  for (std::int64_t kb = 0; kb < blocks; ++kb) {
    if (!visible[0][kb]) continue;
    if (first < 0) first = kb;
    last = kb;
  }
  if (first < 0) return {};
  bool all_full = true;
  for (std::int64_t kb = first; kb <= last; ++kb) all_full = all_full && full[0][kb];
  return {first * kKeyBlock, std::min(g.kv_len, (last + 1) * kKeyBlock), all_full};
}

// Whether the visible keys are the same for every sequence of the batch:
// no term or bias reads a per-sequence tensor.
bool same_for_every_sequence(const AttentionSpec& spec, std::int64_t batch) {
  if (batch == 1) return true;
  const auto per_sequence = [&](const at::Tensor& t, std::int64_t rank) {
    return t.defined() && t.dim() == rank && t.size(0) == batch;
  };
  if (per_sequence(spec.bias, 4)) return false;
  for (const Mask& m : spec.masks) {
    switch (m.kind) {
      case MaskKind::causal:
      case MaskKind::sliding_window:
      case MaskKind::chunked_causal:
        break;
      case MaskKind::tensor:
        if (per_sequence(m.tensor, 4)) return false;
        break;
      case MaskKind::block:
        if (per_sequence(m.block.kv_num_blocks, 3)) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

// In `acc`, with `cache` [..., keys, D] a view of the cache:
//   scores (keys_are_columns): a [..., M, D] @ cache^T -> [..., M, keys];
//   output:                    a [..., M, keys] @ cache -> [..., M, D].
// A narrow (16-bit) cache is converted about kConvertElements elements at a
// time, in its own layout (a converted slice is contiguous, the transpose a
// view), never as a whole.
at::Tensor cache_matmul(const at::Tensor& a, const at::Tensor& cache, bool keys_are_columns,
                        at::ScalarType acc) {
  const auto product = [&](const at::Tensor& x, const at::Tensor& c) {
    return at::matmul(x, keys_are_columns ? c.transpose(-1, -2) : c);
  };
  if (cache.scalar_type() == acc) return product(a, cache);
  if (cache.numel() == 0) return product(a, cache.to(acc));  // no elements to pace
  const std::int64_t keys = cache.size(-2);
  const std::int64_t step = std::max<std::int64_t>(16, kConvertElements * keys / cache.numel());
  std::vector<at::Tensor> parts;
  at::Tensor sum;
  for (std::int64_t k0 = 0; k0 < keys; k0 += step) {
    const std::int64_t n = std::min(step, keys - k0);
    const at::Tensor slice = cache.narrow(-2, k0, n).to(acc);
    if (keys_are_columns) {
      parts.push_back(product(a, slice));  // the scores of these keys
    } else {
      const at::Tensor part = product(a.narrow(-1, k0, n), slice);  // their share of the output
      sum = sum.defined() ? sum + part : part;
    }
  }
  return keys_are_columns ? at::cat(parts, -1) : sum;
}

}  // namespace

bool decode_serves(const at::Tensor& q, const at::Tensor& k) {
  return q.device().is_cpu() && q.size(2) >= 1 && q.size(2) <= kDecodeMaxQueries && k.size(2) >= 1;
}

BlockSparseResult decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionSpec& spec, double scale) {
  const at::ScalarType acc = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const std::int64_t batch = q.size(0);
  const std::int64_t q_heads = q.size(1);
  const std::int64_t q_len = q.size(2);
  const std::int64_t kv_heads = k.size(1);
  const std::int64_t kv_len = k.size(2);
  const std::int64_t head_dim = q.size(3);
  const std::int64_t value_dim = v.size(3);
  const std::int64_t group = q_heads / kv_heads;
  const at::TensorOptions acc_options = q.options().dtype(acc);
  // The scale is folded into q; query head h reads kv head h / group, so the
  // group's queries are the rows [group * Lq] of one product with that head.
  const at::Tensor qs = q.to(acc) * scale;

  // Sequences [b0, b0 + nb) that see the same keys, as one batched product.
  double read = 0;
  at::Tensor anchor;
  const auto attend = [&](std::int64_t b0, std::int64_t nb, const AttentionSpec& sb,
                          std::vector<at::Tensor>& outs, std::vector<at::Tensor>& lses) {
    const MaskGeometry g{nb, q_heads, q_len, kv_len};
    const std::optional<KeyRange> exact = interval_range(sb, g);
    const KeyRange range = exact ? *exact : classified_range(sb, g);
    const std::int64_t len = range.hi - range.lo;
    if (len <= 0) {
      // Nothing visible: output 0 and lse -inf, still on the graph.
      if (!anchor.defined()) anchor = zero_tied_to_inputs(qs, k, v, spec).to(acc);
      outs.push_back(at::zeros({nb, q_heads, q_len, value_dim}, acc_options) + anchor);
      lses.push_back(at::full({nb, q_heads, q_len}, kMinusInf, acc_options));
      return;
    }
    read += static_cast<double>(nb * len);
    // Views of the cache: [nb, Hkv, len, E] and [nb, Hkv, len, Ev].
    const at::Tensor kb = k.narrow(0, b0, nb).narrow(2, range.lo, len);
    const at::Tensor vb = v.narrow(0, b0, nb).narrow(2, range.lo, len);
    const at::Tensor qg = qs.narrow(0, b0, nb).reshape({nb, kv_heads, group * q_len, head_dim});

    at::Tensor s =
        cache_matmul(qg, kb, /*keys_are_columns=*/true, acc).view({nb, q_heads, q_len, len});
    if (spec.softcap > 0) s = (s / spec.softcap).tanh() * spec.softcap;
    if (sb.alibi_slopes.defined() || sb.bias.defined() || !range.full) {
      const at::Tensor keys = at::arange(range.lo, range.hi, q.options().dtype(at::kLong));
      s = add_score_modifiers(s, sb, 0, q_len, keys, q_len, kv_len);
      if (!range.full) {
        s = s.masked_fill(materialize_tile(sb, g, 0, q_len, keys).logical_not(), kMinusInf);
      }
    }
    const RowSoftmax p = row_softmax(s);
    const at::Tensor w = p.weights_unnormalised.reshape({nb, kv_heads, group * q_len, len});
    const at::Tensor o =
        cache_matmul(w, vb, /*keys_are_columns=*/false, acc).view({nb, q_heads, q_len, value_dim});
    outs.push_back(o / p.denominator);
    lses.push_back(p.lse.squeeze(-1));
  };

  std::vector<at::Tensor> outs;
  std::vector<at::Tensor> lses;
  if (same_for_every_sequence(spec, batch)) {
    attend(0, batch, spec, outs, lses);
  } else {
    for (std::int64_t b = 0; b < batch; ++b) attend(b, 1, batch_slice(spec, b, batch), outs, lses);
  }
  BlockSparseResult result;
  result.out = (outs.size() == 1 ? outs[0] : at::cat(outs, 0)).to(q.scalar_type());
  result.lse = lses.size() == 1 ? lses[0] : at::cat(lses, 0);
  result.visible_fraction = read / static_cast<double>(batch * kv_len);
  return result;
}

}  // namespace keel::compat
