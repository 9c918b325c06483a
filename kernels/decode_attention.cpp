#include "decode_attention.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include "accumulation.h"
#include "attention_mask.h"
#include "fused_decode.h"
#include "row_softmax.h"

namespace keel::kernels {

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
// Queries per block on the flash kernel: bounds its additive mask to
// group * rows * keys elements.
constexpr std::int64_t kFlashQueryRows = 128;
// The most keys and values of one kv head (bytes) that the grouped-query
// layout reads once per query head of the group (flash_piece): half of this
// machine's 2 MiB L2 per core.
constexpr std::int64_t kHeadsLayoutBytes = std::int64_t{1} << 20;

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

// One side of the cache (keys or values) as the kernel reads it: a
// contiguous [B, Hkv, Lk, X] tensor, or a pool of pages [P, Hkv, page_size,
// X] and one sequence's page ids (key j is row j % page_size of page
// pages[j / page_size]).
struct CacheSide {
  const at::Tensor& t;
  const std::int64_t* pages = nullptr;
  std::int64_t page_size = 0;
};

// The keys [lo, hi) that some query of the sequence may see, and whether
// every query sees all of them; [inner_lo, inner_hi) within it, keys that
// every query sees (empty when unknown).
struct KeyRange {
  std::int64_t lo = 0;
  std::int64_t hi = 0;
  bool full = false;
  std::int64_t inner_lo = 0;
  std::int64_t inner_hi = 0;
};

// One document term of one sequence, read once per call: its queries' ids,
// and the runs of equal ids among its keys (run i is keys [starts[i],
// starts[i + 1]), of id ids[i]), so that a query's document is looked up
// among the runs, not found by a scan of the keys.
struct DocumentRuns {
  std::vector<std::int64_t> q_ids;
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> starts;  // one more than ids: the last is Lk

  // The keys of document d as [lo, hi) (lo == hi when no key has it); no
  // value when they are not one interval (d has two runs or more).
  std::optional<std::pair<std::int64_t, std::int64_t>> keys_of(std::int64_t d) const {
    std::pair<std::int64_t, std::int64_t> span{0, 0};
    bool seen = false;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] != d) continue;
      if (seen) return std::nullopt;
      seen = true;
      span = {starts[i], starts[i + 1]};
    }
    return span;
  }
};

// The document terms of `spec`, in the order of its masks, for a spec of one
// sequence (ids of batch 1). None when the spec holds more sequences, or
// combines its terms with any_of (their document terms then take the block
// classifier).
std::vector<DocumentRuns> document_runs(const AttentionSpec& spec, std::int64_t sequences) {
  std::vector<DocumentRuns> runs;
  if (sequences != 1 || (spec.combine != MaskCombine::all_of && spec.masks.size() > 1)) {
    return runs;
  }
  for (const Mask& m : spec.masks) {
    if (m.kind != MaskKind::document) continue;
    DocumentRuns d;
    const at::Tensor q = m.q_document_ids.to(at::kLong).contiguous();
    const at::Tensor kv = m.kv_document_ids.to(at::kLong).contiguous();
    const std::int64_t* qp = q.data_ptr<std::int64_t>();
    d.q_ids.assign(qp, qp + q.numel());
    const std::int64_t* kp = kv.data_ptr<std::int64_t>();
    const std::int64_t n = kv.numel();
    for (std::int64_t j = 0; j < n; ++j) {
      if (j == 0 || kp[j] != kp[j - 1]) {
        d.ids.push_back(kp[j]);
        d.starts.push_back(j);
      }
    }
    d.starts.push_back(n);
    runs.push_back(std::move(d));
  }
  return runs;
}

// The range from the mask spec's own arithmetic, for terms whose visible keys
// are an interval per query (causal, sliding window, key padding, and a
// document whose keys are one run of `docs`) combined with all_of: exact, so
// that a single query (Lq = 1) never needs a mask. Empty (no value) when
// another term or any_of needs the block classifier. Over queries [q0, q0 +
// rows).
std::optional<KeyRange> interval_range(const AttentionSpec& spec, const MaskGeometry& g,
                                       std::int64_t q0, std::int64_t rows,
                                       const std::vector<DocumentRuns>& docs) {
  if (spec.combine != MaskCombine::all_of && spec.masks.size() > 1) return std::nullopt;
  KeyRange r{0, g.kv_len, true, 0, g.kv_len};
  std::size_t doc = 0;
  for (const Mask& m : spec.masks) {
    const std::int64_t p0 = query_offset(m.alignment, g) + q0;  // first query's position
    const std::int64_t p1 = p0 + rows - 1;                      // last query's position
    switch (m.kind) {
      case MaskKind::causal:
        r.hi = std::min(r.hi, p1 + 1);
        r.inner_hi = std::min(r.inner_hi, p0 + 1);
        r.full = r.full && rows == 1;
        break;
      case MaskKind::sliding_window:
        // The core saturates the window to Lq + Lk: no overflow here.
        r.lo = std::max(r.lo, p0 - m.window_left);
        r.hi = std::min(r.hi, p1 + m.window_right + 1);
        r.inner_lo = std::max(r.inner_lo, p1 - m.window_left);
        r.inner_hi = std::min(r.inner_hi, p0 + m.window_right + 1);
        r.full = r.full && rows == 1;
        break;
      case MaskKind::key_padding: {
        const auto len = m.kv_lengths.item<std::int64_t>();
        r.hi = std::min(r.hi, len);
        r.inner_hi = std::min(r.inner_hi, len);
        break;
      }
      case MaskKind::document: {
        if (doc >= docs.size()) return std::nullopt;
        const DocumentRuns& d = docs[doc++];
        // The hull of the rows' documents, and the keys all of them share.
        std::int64_t hull_lo = g.kv_len, hull_hi = 0, common_lo = 0, common_hi = g.kv_len;
        std::optional<std::pair<std::int64_t, std::int64_t>> keys;
        for (std::int64_t i = q0; i < q0 + rows; ++i) {
          const std::int64_t id = d.q_ids[static_cast<std::size_t>(i)];
          if (i == q0 || id != d.q_ids[static_cast<std::size_t>(i - 1)]) keys = d.keys_of(id);
          if (!keys) return std::nullopt;
          common_lo = std::max(common_lo, keys->first);
          common_hi = std::min(common_hi, keys->second);
          if (keys->first == keys->second) continue;
          hull_lo = std::min(hull_lo, keys->first);
          hull_hi = std::max(hull_hi, keys->second);
        }
        if (hull_hi <= hull_lo) return KeyRange{};
        r.full = r.full && common_lo == hull_lo && common_hi == hull_hi;
        r.lo = std::max(r.lo, hull_lo);
        r.hi = std::min(r.hi, hull_hi);
        r.inner_lo = std::max(r.inner_lo, common_lo);
        r.inner_hi = std::min(r.inner_hi, common_hi);
        break;
      }
      default:
        return std::nullopt;
    }
  }
  if (r.hi <= r.lo) return KeyRange{};
  r.inner_lo = std::max(r.inner_lo, r.lo);
  r.inner_hi = std::min(r.inner_hi, r.hi);
  if (r.inner_hi < r.inner_lo) r.inner_hi = r.inner_lo;
  return r;
}

// The hull of the key blocks visible from query block `qb` of `c`.
KeyRange classified_range(const BlockClasses& c, std::int64_t qb, std::int64_t kv_len) {
  const auto visible = c.visible.accessor<bool, 2>();
  const auto full = c.full.accessor<bool, 2>();
  const std::int64_t blocks = c.visible.size(1);
  std::int64_t first = -1;
  std::int64_t last = -1;
  for (std::int64_t kb = 0; kb < blocks; ++kb) {
    if (!visible[qb][kb]) continue;
    if (first < 0) first = kb;
    last = kb;
  }
  if (first < 0) return {};
  bool all_full = true;
  // The longest run of key blocks every query sees whole.
  std::int64_t run0 = 0, run1 = 0;
  for (std::int64_t kb = first, start = first; kb <= last; ++kb) {
    all_full = all_full && full[qb][kb];
    if (!full[qb][kb]) {
      start = kb + 1;
    } else if (kb + 1 - start > run1 - run0) {
      run0 = start;
      run1 = kb + 1;
    }
  }
  return {first * kKeyBlock, std::min(kv_len, (last + 1) * kKeyBlock), all_full, run0 * kKeyBlock,
          std::min(kv_len, run1 * kKeyBlock)};
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

// Rows of `x` elements of a cache in `D` (float or double): `rows` rows at
// `src`, `row_stride` apart, `elem_stride` between elements, into `dst`,
// one row after the other.
template <typename S, typename D>
void widen_rows(const S* src, std::int64_t row_stride, std::int64_t elem_stride, D* dst,
                std::int64_t rows, std::int64_t x) {
  for (std::int64_t r = 0; r < rows; ++r, src += row_stride, dst += x) {
    if (elem_stride == 1) {
      if constexpr (std::is_same_v<S, at::BFloat16> && std::is_same_v<D, float>) {
        // bfloat16 is the top half of a float32: a shift, which vectorises
        // (ATen's own conversion ran at about 1.3 GB/s here).
        const auto* bits = reinterpret_cast<const std::uint16_t*>(src);
        for (std::int64_t e = 0; e < x; ++e) {
          const std::uint32_t wide = static_cast<std::uint32_t>(bits[e]) << 16;
          std::memcpy(dst + e, &wide, sizeof wide);
        }
      } else {
        for (std::int64_t e = 0; e < x; ++e) dst[e] = static_cast<D>(src[e]);
      }
    } else {
      for (std::int64_t e = 0; e < x; ++e) dst[e] = static_cast<D>(src[e * elem_stride]);
    }
  }
}

// Keys [k0, k0 + n) of sequences [b0, b0 + nb) of `side` into `dst`, a
// contiguous [nb, Hkv, n, X] buffer of D: read where they lie (contiguous
// rows, or the rows of each page the sequence's table names).
template <typename S, typename D>
void fill_tile(const CacheSide& side, std::int64_t b0, std::int64_t nb, std::int64_t k0,
               std::int64_t n, D* dst) {
  const at::Tensor& t = side.t;
  const S* base = t.data_ptr<S>();
  const std::int64_t heads = t.size(1);
  const std::int64_t x = t.size(3);
  const std::int64_t s0 = t.stride(0);
  const std::int64_t s1 = t.stride(1);
  const std::int64_t s2 = t.stride(2);
  const std::int64_t s3 = t.stride(3);
  for (std::int64_t b = 0; b < nb; ++b) {
    for (std::int64_t h = 0; h < heads; ++h) {
      D* out = dst + (b * heads + h) * n * x;
      if (side.pages == nullptr) {
        widen_rows(base + (b0 + b) * s0 + h * s1 + k0 * s2, s2, s3, out, n, x);
        continue;
      }
      for (std::int64_t j = k0; j < k0 + n;) {
        const std::int64_t page = side.pages[j / side.page_size];
        const std::int64_t row = j % side.page_size;
        const std::int64_t m = std::min(side.page_size - row, k0 + n - j);
        widen_rows(base + page * s0 + h * s1 + row * s2, s2, s3, out + (j - k0) * x, m, x);
        j += m;
      }
    }
  }
}

void fill_tile(const CacheSide& side, std::int64_t b0, std::int64_t nb, std::int64_t k0,
               std::int64_t n, at::Tensor& dst) {
  const bool wide = dst.scalar_type() == at::kDouble;
  switch (side.t.scalar_type()) {
    case at::kDouble:
      return fill_tile<double>(side, b0, nb, k0, n, dst.data_ptr<double>());
    case at::kFloat:
      if (wide) return fill_tile<float>(side, b0, nb, k0, n, dst.data_ptr<double>());
      return fill_tile<float>(side, b0, nb, k0, n, dst.data_ptr<float>());
    case at::kBFloat16:
      return fill_tile<at::BFloat16>(side, b0, nb, k0, n, dst.data_ptr<float>());
    case at::kHalf:
      return fill_tile<at::Half>(side, b0, nb, k0, n, dst.data_ptr<float>());
    default:
      throw std::invalid_argument("decode_attention: a cache of dtype " +
                                  std::string(c10::toString(side.t.scalar_type())));
  }
}

// In `acc`, over keys [lo, lo + len) of sequences [b0, b0 + nb) of `side`:
//   scores (keys_are_columns): a [nb, Hkv, M, E] @ keys^T -> [nb, Hkv, M, len];
//   output:                    a [nb, Hkv, M, len] @ values -> [nb, Hkv, M, Ev].
// A contiguous cache in `acc` is one product over a view of it. Otherwise
// (pages, a narrow dtype) the keys go through a tile of about
// kConvertElements elements, filled where they lie and reused, never a copy
// of the whole range; a narrow cache that autograd must reach is converted
// by ATen, a slice at a time, on the graph.
at::Tensor cache_matmul(const at::Tensor& a, const CacheSide& side, std::int64_t b0,
                        std::int64_t nb, std::int64_t lo, std::int64_t len, bool keys_are_columns,
                        at::ScalarType acc) {
  const auto product = [&](const at::Tensor& x, const at::Tensor& c) {
    return at::matmul(x, keys_are_columns ? c.transpose(-1, -2) : c);
  };
  const std::int64_t heads = side.t.size(1);
  const std::int64_t x = side.t.size(3);
  if (side.pages == nullptr) {
    const at::Tensor view = side.t.narrow(0, b0, nb).narrow(2, lo, len);
    if (view.scalar_type() == acc) return product(a, view);
    if (view.numel() == 0) return product(a, view.to(acc));  // no elements to pace
  }
  // Autograd keeps the keys of each product for its backward: a tile that
  // is refilled cannot be those keys when any operand needs a gradient.
  const bool on_graph = side.pages == nullptr && at::GradMode::is_enabled() &&
                        (side.t.requires_grad() || a.requires_grad());
  const std::int64_t step =
      std::max<std::int64_t>(16, kConvertElements / std::max<std::int64_t>(1, nb * heads * x));
  at::Tensor tile;
  std::vector<at::Tensor> parts;
  at::Tensor sum;
  for (std::int64_t k0 = 0; k0 < len; k0 += step) {
    const std::int64_t n = std::min(step, len - k0);
    at::Tensor keys;
    if (on_graph) {
      keys = side.t.narrow(0, b0, nb).narrow(2, lo + k0, n).to(acc);
    } else {
      if (!tile.defined() || tile.size(2) != n)
        tile = at::empty({nb, heads, n, x}, a.options().dtype(acc));
      fill_tile(side, b0, nb, lo + k0, n, tile);
      keys = tile;
    }
    if (keys_are_columns) {
      parts.push_back(product(a, keys));  // the scores of these keys
    } else {
      const at::Tensor part = product(a.narrow(-1, k0, n), keys);  // their share of the output
      sum = sum.defined() ? sum + part : part;
    }
  }
  if (!keys_are_columns) return sum;
  return parts.size() == 1 ? parts[0] : at::cat(parts, -1);
}

// Whether libtorch's CPU flash kernel can serve blocks of this call over a
// contiguous cache: no score modifier (the kernel adds none), Ev == E,
// 16-bit or float32 inputs (float64 keeps keel's own products).
// libtorch's derivative of the kernel drops the gradient of its lse, so a
// call whose lse autograd must reach keeps keel's products.
bool flash_serves(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const AttentionSpec& spec) {
  const bool lse_on_graph = spec.return_lse && at::GradMode::is_enabled() &&
                            (q.requires_grad() || k.requires_grad() || v.requires_grad());
  // The kernel divides by its sizes: an empty tensor (head dim 0 included)
  // keeps keel's products, which take it.
  const bool empty = q.numel() == 0 || k.numel() == 0 || v.numel() == 0;
  return spec.softcap == 0 && !spec.alibi_slopes.defined() && !spec.bias.defined() &&
         v.size(3) == q.size(3) && q.scalar_type() != at::kDouble && !lse_on_graph && !empty;
}

// The most query rows per kv head of a float32 contiguous cache that the
// fused kernel takes. Beyond them keel's grouped products (GEMMs) compute as
// fast or faster than its dot products: 32/1 (32 rows), B=8 Lk=8192, float32
// 12.1 against 15.5 ms fused at one thread and 7.0 against 9.5 at two. In
// bfloat16 the products are the slower ones (libtorch's bfloat16 GEMM), so a
// bfloat16 cache takes the fused kernel up to kFusedMaxRows: 32/1, same run,
// 15.4 against 17.5 ms at one thread, 7.9 against 8.8 at two, and a
// 513-key window at B=1 Lk=32768 0.21 against 0.29 and 0.13 against 0.21.
constexpr std::int64_t kFusedContiguousRowsF32 = 16;

// Up to this many visible keys in one call (summed over the sequences that
// share them), a float32 contiguous cache takes the fused kernel past
// kFusedContiguousRowsF32 rows all the same: over so few keys, the GEMMs'
// fixed cost is most of their time. 32/1 float32, same binary, one thread,
// ms fused / GEMMs: a 513-key window at B=1 0.15 / 0.17-0.19, the 192 keys
// of a document at B=8 (a call per sequence) 0.66-0.69 / 0.74-0.79, 1024
// keys at B=1 0.30 / 0.31-0.36; a 513-key window at B=8 (one call of 4104
// keys) 0.94-0.97 / 0.80-0.88, 8192 keys at B=1 1.82-1.90 / 1.50.
constexpr std::int64_t kFusedShortKeysF32 = 1024;

// The most visible keys of one call (over its sequences) for which the fused
// kernel (fused_decode.h) serves the call's `rows` queries on this machine,
// 0 when it serves none: float32 or bfloat16 q, k and v, no score modifier,
// rows of adjacent elements in the cache, off the autograd graph, and up to
// kFusedMaxRows rows per kv head; a float32 contiguous cache past
// kFusedContiguousRowsF32 rows only over kFusedShortKeysF32 keys. Measured
// against the other routes, same binary, libtorch 2.15.0, 1 and 2 threads
// (docs/benchmarks.md, "The fused decode kernel, faster per thread"):
// - pages, B=8 Lk=8192: 0.25-0.82 of the time of keel's products;
// - contiguous 32/8, B=8 Lk=8192: 0.53-0.88 of the time of the routes it
//   replaces (keel's products, the flash kernel);
// - contiguous 32/32: 0.68-0.98 of the flash kernel's time at B=8; at B=1
//   Lk=1024, 0.77-1.19 (under a millisecond: bfloat16 at two threads is the
//   1.19).
std::int64_t fused_keys(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const AttentionSpec& spec, std::int64_t group, std::int64_t rows,
                        bool paged) {
  const at::ScalarType dtype = q.scalar_type();
  const bool grad =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  const bool serves = (dtype == at::kFloat || dtype == at::kBFloat16) && k.scalar_type() == dtype &&
                      v.scalar_type() == dtype && !grad && spec.softcap == 0 &&
                      !spec.alibi_slopes.defined() && !spec.bias.defined() &&
                      group * rows <= kFusedMaxRows && k.stride(3) == 1 && v.stride(3) == 1 &&
                      fused_decode_runs_here(q.size(3), v.size(3));
  if (!serves) return 0;
  const bool gemms_faster = !paged && dtype == at::kFloat && group * rows > kFusedContiguousRowsF32;
  return gemms_faster ? kFusedShortKeysF32 : std::numeric_limits<std::int64_t>::max();
}

}  // namespace

bool decode_serves(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const AttentionSpec& spec) {
  const std::int64_t q_len = q.size(2);
  const std::int64_t kv_len = k.size(2);
  if (!q.device().is_cpu() || q_len < 1 || kv_len < 1) return false;
  if (q_len <= kDecodeMaxQueries) return true;
  // Chunked prefill: new tokens against a longer cache, on the flash kernel.
  return q_len < kv_len && q_len <= kPrefillMaxQueries && flash_serves(q, k, v, spec);
}

AttentionSpec paged_sequence_spec(const AttentionSpec& spec, std::int64_t b, std::int64_t batch,
                                  std::int64_t len, std::int64_t logical_len) {
  AttentionSpec s = batch_slice(spec, b, batch);
  const auto narrow_keys = [&](at::Tensor& t) {
    if (t.defined() && t.dim() > 0 && t.size(-1) == logical_len && logical_len != 1) {
      t = t.narrow(-1, 0, len);
    }
  };
  for (Mask& m : s.masks) {
    narrow_keys(m.kv_document_ids);
    narrow_keys(m.tensor);
  }
  narrow_keys(s.bias);
  return s;
}

namespace {

// One call's queries and the state its sequences share.
class Attend {
 public:
  // `nothing` gives the output of a block that sees no key (0, on the graph
  // where autograd must reach the inputs); called only for such a block.
  Attend(const at::Tensor& q, std::int64_t kv_heads, std::int64_t value_dim, double scale,
         std::function<at::Tensor()> nothing)
      : q_(q),
        nothing_(std::move(nothing)),
        acc_(accumulation_dtype(q.scalar_type())),
        q_heads_(q.size(1)),
        q_len_(q.size(2)),
        kv_heads_(kv_heads),
        value_dim_(value_dim),
        group_(q.size(1) / kv_heads),
        scale_(scale) {}

  // Sequences [b0, b0 + nb) of q, which see the same keys under `sb`,
  // against sequences [c0, c0 + nb) of the cache (kv_len keys each), a
  // block of queries at a time: kFlashQueryRows on the flash kernel,
  // kDecodeMaxQueries with keel's products (their scores are materialised).
  void sequences(std::int64_t b0, std::int64_t nb, const CacheSide& k, const CacheSide& v,
                 std::int64_t c0, std::int64_t kv_len, const AttentionSpec& sb) {
    const MaskGeometry g{nb, q_heads_, q_len_, kv_len};
    // The fused kernel takes every query at once; a block it cannot take
    // (a mask that is not an interval per query, more keys than fused_keys
    // allows) goes to the other routes.
    const std::int64_t fused_keys_most =
        fused_keys(q_, k.t, v.t, sb, group_, q_len_, k.pages != nullptr);
    const bool fused = fused_keys_most > 0;
    const bool flash = k.pages == nullptr && flash_serves(q_, k.t, v.t, sb);
    const std::int64_t block_rows = fused ? q_len_ : (flash ? kFlashQueryRows : kDecodeMaxQueries);
    blocks_ = std::max(blocks_, block_count(q_len_, block_rows));
    BlockClasses classes;
    std::vector<at::Tensor> outs;
    std::vector<at::Tensor> lses;
    const std::vector<DocumentRuns> docs = document_runs(sb, nb);
    for (std::int64_t q0 = 0; q0 < q_len_; q0 += block_rows) {
      const std::int64_t rows = std::min(block_rows, q_len_ - q0);
      std::optional<KeyRange> range = interval_range(sb, g, q0, rows, docs);
      if (!range) {
        if (!classes.visible.defined()) {
          classes = classify_blocks(sb, g, at::kCPU, block_rows, kKeyBlock);
        }
        range = classified_range(classes, q0 / block_rows, kv_len);
      }
      std::vector<std::int64_t> lo, hi;
      if (range->hi <= range->lo) {
        nothing_visible(nb, rows, outs, lses);
      } else if (fused && nb * (range->hi - range->lo) <= fused_keys_most &&
                 row_intervals(sb, g, q0, rows, docs, *range, lo, hi)) {
        fused_block(b0, nb, q0, rows, k, v, c0, lo, hi, outs, lses);
      } else if (flash) {
        flash_block(b0, nb, q0, rows, k.t, v.t, c0, g, *range, sb, outs, lses);
      } else {
        block(b0, nb, q0, rows, k, v, c0, g, *range, sb, outs, lses);
      }
    }
    outs_.push_back(outs.size() == 1 ? outs[0] : at::cat(outs, 2));
    lses_.push_back(lses.size() == 1 ? lses[0] : at::cat(lses, 2));
  }

  // `keys` is the number of keys the cache holds, over every sequence.
  BlockSparseResult result(std::int64_t keys) && {
    BlockSparseResult r;
    r.out = (outs_.size() == 1 ? outs_[0] : at::cat(outs_, 0)).to(q_.scalar_type());
    r.lse = lses_.size() == 1 ? lses_[0] : at::cat(lses_, 0);
    // Each block of queries reads the cache again.
    r.visible_fraction = keys > 0 ? read_ / static_cast<double>(keys * blocks_) : 0.0;
    return r;
  }

 private:
  // Each query's visible keys as one interval, [lo[r], hi[r]) for query q0 +
  // r: the block's range when every query sees all of it, else each query's
  // own interval from the mask's arithmetic. False when a query's keys are
  // not one interval (a document in pieces, a boolean mask, any_of).
  static bool row_intervals(const AttentionSpec& sb, const MaskGeometry& g, std::int64_t q0,
                            std::int64_t rows, const std::vector<DocumentRuns>& docs,
                            const KeyRange& range, std::vector<std::int64_t>& lo,
                            std::vector<std::int64_t>& hi) {
    lo.assign(static_cast<std::size_t>(rows), range.lo);
    hi.assign(static_cast<std::size_t>(rows), range.hi);
    if (range.full) return true;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::optional<KeyRange> own = interval_range(sb, g, q0 + r, 1, docs);
      if (!own || !own->full) return false;
      lo[static_cast<std::size_t>(r)] = own->lo;
      hi[static_cast<std::size_t>(r)] = own->hi;
    }
    return true;
  }

  // The block on keel's fused kernel (fused_decode.h): each kv head's rows
  // against the visible keys, read where they lie, in the cache's dtype.
  void fused_block(std::int64_t b0, std::int64_t nb, std::int64_t q0, std::int64_t rows,
                   const CacheSide& k, const CacheSide& v, std::int64_t c0,
                   const std::vector<std::int64_t>& lo, const std::vector<std::int64_t>& hi,
                   std::vector<at::Tensor>& outs, std::vector<at::Tensor>& lses) {
    const std::int64_t first = *std::min_element(lo.begin(), lo.end());
    const std::int64_t last = *std::max_element(hi.begin(), hi.end());
    read_ += static_cast<double>(nb * std::max<std::int64_t>(0, last - first));
    const at::TensorOptions options = q_.options().dtype(at::kFloat);
    at::Tensor out = at::empty({nb, q_heads_, rows, value_dim_}, options);
    at::Tensor lse = at::empty({nb, q_heads_, rows}, options);
    const auto rows_of = [](const CacheSide& side) {
      const at::Tensor& t = side.t;
      return CacheRows{t.data_ptr(), t.stride(0), t.stride(1),
                       t.stride(2),  side.pages,  side.page_size};
    };
    FusedDecodeCall c;
    c.dtype = q_.scalar_type();
    c.q = q_.data_ptr();
    for (int d = 0; d < 4; ++d) c.q_strides[d] = q_.stride(d);
    c.k = rows_of(k);
    c.v = rows_of(v);
    c.b0 = b0;
    c.nb = nb;
    c.c0 = c0;
    c.q0 = q0;
    c.rows = rows;
    c.kv_heads = kv_heads_;
    c.group = group_;
    c.head_dim = q_.size(3);
    c.value_dim = value_dim_;
    c.scale = static_cast<float>(scale_);
    c.lo = lo.data();
    c.hi = hi.data();
    c.out = out.data_ptr<float>();
    c.lse = lse.data_ptr<float>();
    fused_decode(c);
    outs.push_back(std::move(out));
    lses.push_back(std::move(lse));
  }

  void block(std::int64_t b0, std::int64_t nb, std::int64_t q0, std::int64_t rows,
             const CacheSide& k, const CacheSide& v, std::int64_t c0, const MaskGeometry& g,
             const KeyRange& range, const AttentionSpec& sb, std::vector<at::Tensor>& outs,
             std::vector<at::Tensor>& lses) {
    const std::int64_t len = range.hi - range.lo;
    read_ += static_cast<double>(nb * len);
    // For keel's products the scale is folded into q (once per call, and
    // only where they run); query head h reads kv head h / group, so the
    // group's queries are the rows of one product with that head.
    if (!qs_.defined()) qs_ = q_.to(acc_) * scale_;
    const at::Tensor qg = group_rows(qs_, b0, nb, q0, rows);
    at::Tensor s = cache_matmul(qg, k, c0, nb, range.lo, len, /*keys_are_columns=*/true, acc_)
                       .view({nb, q_heads_, rows, len});
    if (sb.softcap > 0) s = (s / sb.softcap).tanh() * sb.softcap;
    if (sb.alibi_slopes.defined() || sb.bias.defined() || !range.full) {
      const at::Tensor keys = at::arange(range.lo, range.hi, q_.options().dtype(at::kLong));
      s = add_score_modifiers(s, sb, q0, rows, keys, g.q_len, g.kv_len);
      if (!range.full) {
        s = s.masked_fill(materialize_tile(sb, g, q0, rows, keys).logical_not(), kMinusInf);
      }
    }
    const RowSoftmax p = row_softmax(s);
    const at::Tensor w = p.weights_unnormalised.reshape({nb, kv_heads_, group_ * rows, len});
    const at::Tensor o = cache_matmul(w, v, c0, nb, range.lo, len, /*keys_are_columns=*/false, acc_)
                             .view({nb, q_heads_, rows, value_dim_});
    outs.push_back(o / p.denominator);
    lses.push_back(p.lse.squeeze(-1));
  }

  // A block whose queries see no key: output 0 and lse -inf, still on the
  // graph.
  void nothing_visible(std::int64_t nb, std::int64_t rows, std::vector<at::Tensor>& outs,
                       std::vector<at::Tensor>& lses) {
    const at::TensorOptions options = q_.options().dtype(acc_);
    if (!anchor_.defined()) anchor_ = nothing_().to(acc_);
    outs.push_back(at::zeros({nb, q_heads_, rows, value_dim_}, options) + anchor_);
    lses.push_back(at::full({nb, q_heads_, rows}, kMinusInf, options));
  }

  // The block on libtorch's CPU flash kernel (flash_piece says in which
  // layout), against views of the visible keys in the cache's own dtype.
  // Keys every query sees run without a mask; only
  // the keys some query does not see carry one (additive, the layout of the
  // rows), in calls of their own merged by log-sum-exp, so that a chunk of
  // prefill masks its diagonal, not the whole cache. The merge needs the
  // pieces' lse on the graph, which libtorch's derivative drops: with
  // autograd on, the range stays one masked call.
  void flash_block(std::int64_t b0, std::int64_t nb, std::int64_t q0, std::int64_t rows,
                   const at::Tensor& k, const at::Tensor& v, std::int64_t c0, const MaskGeometry& g,
                   const KeyRange& range, const AttentionSpec& sb, std::vector<at::Tensor>& outs,
                   std::vector<at::Tensor>& lses) {
    read_ += static_cast<double>(nb * (range.hi - range.lo));
    const bool grad = at::GradMode::is_enabled() &&
                      (q_.requires_grad() || k.requires_grad() || v.requires_grad());
    // Splitting costs a call or two and a merge; it pays where the masked
    // keys are few beside the rest (a causal diagonal against a long cache,
    // measured 0.84-0.98 of SDPA where one masked call was 0.93-1.40), not
    // where they are a good part of the range (a window: one call is faster).
    const std::int64_t inner = range.inner_hi - range.inner_lo;
    // Decode (Lq <= kDecodeMaxQueries) keeps one call: its mask is small and
    // the split is not measured there.
    const bool split = q_len_ > kDecodeMaxQueries && !range.full && !grad &&
                       inner >= 4 * (range.hi - range.lo - inner);
    if (!split) {
      auto [o, l] = flash_piece(b0, nb, q0, rows, k, v, c0, g, range.lo, range.hi, !range.full, sb);
      outs.push_back(std::move(o));
      lses.push_back(std::move(l));
      return;
    }
    std::vector<std::pair<at::Tensor, at::Tensor>> pieces;
    if (range.lo < range.inner_lo) {
      pieces.push_back(
          flash_piece(b0, nb, q0, rows, k, v, c0, g, range.lo, range.inner_lo, true, sb));
    }
    pieces.push_back(
        flash_piece(b0, nb, q0, rows, k, v, c0, g, range.inner_lo, range.inner_hi, false, sb));
    if (range.inner_hi < range.hi) {
      pieces.push_back(
          flash_piece(b0, nb, q0, rows, k, v, c0, g, range.inner_hi, range.hi, true, sb));
    }
    std::vector<at::Tensor> ls;
    ls.reserve(pieces.size());
    for (const auto& piece : pieces) ls.push_back(piece.second);
    // Every row sees the inner keys, so its lse is finite.
    const at::Tensor lse = at::logsumexp(at::stack(ls), 0);
    at::Tensor out;
    for (const auto& [o, l] : pieces) {
      const at::Tensor part = o * (l - lse).exp().unsqueeze(-1);
      out = out.defined() ? out + part : part;
    }
    outs.push_back(std::move(out));
    lses.push_back(lse);
  }

  // One call of the flash kernel over keys [lo, hi) of the block: its out
  // [nb, Hq, rows, Ev] and lse [nb, Hq, rows] in the accumulation dtype
  // (lse -inf for a row that sees none of them), with the tile of the mask
  // spec over those keys when `masked` (additive, in the layout of the
  // rows). In the group-rows layout q is [nb, Hkv, group * rows, E], row
  // gi * rows + r being query r of head kv * group + gi.
  std::pair<at::Tensor, at::Tensor> flash_piece(std::int64_t b0, std::int64_t nb, std::int64_t q0,
                                                std::int64_t rows, const at::Tensor& k,
                                                const at::Tensor& v, std::int64_t c0,
                                                const MaskGeometry& g, std::int64_t lo,
                                                std::int64_t hi, bool masked,
                                                const AttentionSpec& sb) const {
    const std::int64_t len = hi - lo;
    // The group's queries as the rows of their kv head: one product reads
    // each key once for the group. Where a 16-bit group has few rows (a
    // decode step of 32/8) over keys that stay in the core's cache between
    // the group's heads (at most kHeadsLayoutBytes of keys and values per kv
    // head), the kernel's own grouped-query layout instead (query heads
    // against fewer kv heads, as SDPA's enable_gqa calls it), which its
    // 16-bit path runs faster there: measured 0.54 against 0.62 ms (B=1
    // Lk=1024 32/8 bfloat16, in 2.9.1, 2.13.0 and 2.15.0 alike). 32 rows
    // (32/1) or more (prefill), float32, and longer ranges (B=8 Lk=8192
    // 32/8: 70 against 51 ms, each key read once per query head) run faster
    // as rows.
    const bool heads_layout =
        q_.scalar_type() != at::kFloat && group_ * rows < 16 &&
        len * (k.size(3) + v.size(3)) * static_cast<std::int64_t>(k.element_size()) <=
            kHeadsLayoutBytes;
    const at::Tensor qh =
        heads_layout ? q_.narrow(0, b0, nb).narrow(2, q0, rows) : group_rows(q_, b0, nb, q0, rows);
    const at::Tensor kb = k.narrow(0, c0, nb).narrow(2, lo, len);
    const at::Tensor vb = v.narrow(0, c0, nb).narrow(2, lo, len);
    std::optional<at::Tensor> mask;
    at::Tensor nonempty;
    if (masked) {
      const at::Tensor keys = at::arange(lo, hi, q_.options().dtype(at::kLong));
      at::Tensor keep = materialize_tile(sb, g, q0, rows, keys);  // [nb|1, Hq|1, rows, len]
      const std::int64_t mb = keep.size(0);
      if (!heads_layout) {
        keep = keep.size(1) == 1 ? keep.unsqueeze(1)
                                       .expand({mb, 1, group_, rows, len})
                                       .reshape({mb, 1, group_ * rows, len})
                                 : keep.reshape({mb, kv_heads_, group_ * rows, len});
      }
      mask = at::zeros(keep.sizes(), q_.options()).masked_fill_(keep.logical_not(), kMinusInf);
      nonempty = keep.any(-1);
      if (nonempty.all().item<bool>()) nonempty = at::Tensor();
    }
    auto [o, l] =
        at::_scaled_dot_product_flash_attention_for_cpu(qh, kb, vb, 0.0, false, mask, scale_);
    // A row that sees no key: the kernel's output is 0, its lse is not -inf.
    if (nonempty.defined()) l = l.masked_fill(nonempty.logical_not(), kMinusInf);
    return {o.reshape({nb, q_heads_, rows, value_dim_}).to(acc_),
            l.reshape({nb, q_heads_, rows}).to(acc_)};
  }

  // Queries [q0, q0 + rows) of sequences [b0, b0 + nb) of `t` ([B, Hq, Lq,
  // E]) as the rows of their kv heads: [nb, Hkv, group * rows, E].
  at::Tensor group_rows(const at::Tensor& t, std::int64_t b0, std::int64_t nb, std::int64_t q0,
                        std::int64_t rows) const {
    return t.narrow(0, b0, nb)
        .narrow(2, q0, rows)
        .reshape({nb, kv_heads_, group_ * rows, t.size(3)});
  }

  const at::Tensor& q_;
  std::function<at::Tensor()> nothing_;
  at::Tensor anchor_;
  at::ScalarType acc_;
  std::int64_t q_heads_, q_len_, kv_heads_, value_dim_, group_;
  double scale_;
  at::Tensor qs_;
  std::vector<at::Tensor> outs_;
  std::vector<at::Tensor> lses_;
  double read_ = 0;
  std::int64_t blocks_ = 1;
};

}  // namespace

BlockSparseResult decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionSpec& spec, double scale) {
  const std::int64_t batch = q.size(0);
  const std::int64_t kv_len = k.size(2);
  Attend attend(q, k.size(1), v.size(3), scale, [&] { return zero_tied_to_inputs(q, k, v, spec); });
  const CacheSide ks{k};
  const CacheSide vs{v};
  if (same_for_every_sequence(spec, batch)) {
    attend.sequences(0, batch, ks, vs, 0, kv_len, spec);
  } else {
    for (std::int64_t b = 0; b < batch; ++b) {
      attend.sequences(b, 1, ks, vs, b, kv_len, batch_slice(spec, b, batch));
    }
  }
  return std::move(attend).result(batch * kv_len);
}

BlockSparseResult paged_attention(const at::Tensor& q, const PagedKVCache& cache,
                                  const AttentionSpec& spec, double scale) {
  const std::int64_t batch = q.size(0);
  const std::int64_t page_size = cache.k_pages.size(2);
  const at::Tensor table = cache.page_table.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor lengths = cache.lengths.to(at::kCPU, at::kLong).contiguous();
  const std::int64_t logical_len = table.size(1) * page_size;
  // Off the autograd graph: a sequence that sees no key is plain 0.
  Attend attend(q, cache.k_pages.size(1), cache.v_pages.size(3), scale,
                [&] { return at::zeros({}, q.options()); });
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t* pages = table.data_ptr<std::int64_t>() + b * table.size(1);
    const CacheSide ks{cache.k_pages, pages, page_size};
    const CacheSide vs{cache.v_pages, pages, page_size};
    const std::int64_t len = lengths.data_ptr<std::int64_t>()[b];
    attend.sequences(b, 1, ks, vs, 0, len, paged_sequence_spec(spec, b, batch, len, logical_len));
  }
  return std::move(attend).result(lengths.sum().item<std::int64_t>());
}

}  // namespace keel::kernels
