// keel::attention: validation, then dispatch.
#include "keel/v1/attention.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <c10/core/GradMode.h>

#include "dispatch/attention.h"
#include "dispatcher.h"
#include "guard.h"
#include "keel/v1/dtype.h"
#include "validate.h"

namespace keel {
inline namespace v1 {

Mask Mask::causal(CausalAlignment alignment) {
  Mask m;
  m.kind = MaskKind::causal;
  m.alignment = alignment;
  return m;
}

Mask Mask::sliding_window(std::int64_t left, std::int64_t right, CausalAlignment alignment) {
  Mask m;
  m.kind = MaskKind::sliding_window;
  m.window_left = left;
  m.window_right = right;
  m.alignment = alignment;
  return m;
}

Mask Mask::chunked_causal(std::int64_t chunk_size, CausalAlignment alignment) {
  Mask m;
  m.kind = MaskKind::chunked_causal;
  m.chunk_size = chunk_size;
  m.alignment = alignment;
  return m;
}

Mask Mask::prefix_lm(at::Tensor prefix_lengths, CausalAlignment alignment) {
  Mask m;
  m.kind = MaskKind::prefix_lm;
  m.prefix_lengths = std::move(prefix_lengths);
  m.alignment = alignment;
  return m;
}

Mask Mask::document(at::Tensor q_document_ids, at::Tensor kv_document_ids) {
  Mask m;
  m.kind = MaskKind::document;
  m.q_document_ids = std::move(q_document_ids);
  m.kv_document_ids = std::move(kv_document_ids);
  return m;
}

Mask Mask::key_padding(at::Tensor kv_lengths) {
  Mask m;
  m.kind = MaskKind::key_padding;
  m.kv_lengths = std::move(kv_lengths);
  return m;
}

Mask Mask::block_mask(BlockMask block) {
  Mask m;
  m.kind = MaskKind::block;
  m.block = std::move(block);
  return m;
}

Mask Mask::from_tensor(at::Tensor keep) {
  Mask m;
  m.kind = MaskKind::tensor;
  m.tensor = std::move(keep);
  return m;
}

namespace {

constexpr const char* kOp = "attention";

bool is_integer(at::ScalarType t) {
  return at::isIntegralType(t, /*includeBool=*/false);
}

// Shapes of the call, read once from q, k, v.
struct Dims {
  std::int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim, value_dim;
};

result<void> check_device(const char* name, const at::Tensor& t, const at::Tensor& q) {
  return internal::check_same_device(kOp, name, t, "query", q);
}

// An integer tensor of exactly `shape`, on q's device.
result<void> check_index_tensor(const char* name, const at::Tensor& t,
                                const std::vector<std::int64_t>& shape, const char* meaning,
                                const at::Tensor& q) {
  const std::string want = absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  if (!t.defined()) {
    return internal::invalid(kOp, absl::StrCat(name, " is undefined; expected an integer tensor ",
                                               want, " (", meaning, ")"));
  }
  if (!is_integer(t.scalar_type())) {
    return internal::invalid(kOp, absl::StrCat(name, " has dtype ", keel::dtype_name(t),
                                               "; expected an integer dtype (", meaning, ")"));
  }
  if (t.sizes() != at::IntArrayRef(shape)) {
    return internal::invalid(kOp, absl::StrCat(name, " has shape ", internal::shape_text(t),
                                               "; expected ", want, " (", meaning, ")"));
  }
  return check_device(name, t, q);
}

// [B or 1, Hq or 1, ...] as FlexAttention's BlockMask allows.
bool batch_heads_ok(const at::Tensor& t, const Dims& d) {
  return (t.size(0) == d.batch || t.size(0) == 1) && (t.size(1) == d.q_heads || t.size(1) == 1);
}

// How many blocks of `block` cover `length` (both checked > 0 or >= 0),
// without the overflow of (length + block - 1) / block when a caller's
// BlockMask says INT64_MAX.
std::int64_t blocks_of(std::int64_t length, std::int64_t block) {
  return length / block + (length % block != 0 ? 1 : 0);
}

result<void> check_block_mask(const std::string& at, const BlockMask& bm, const Dims& d,
                              const at::Tensor& q) {
  if (bm.q_block_size <= 0 || bm.kv_block_size <= 0) {
    return internal::invalid(kOp, absl::StrCat(at, ".block has block sizes (", bm.q_block_size,
                                               ", ", bm.kv_block_size, "); expected both > 0"));
  }
  const std::int64_t qb = blocks_of(d.q_len, bm.q_block_size);
  const std::int64_t kvb = blocks_of(d.kv_len, bm.kv_block_size);
  const auto check_pair = [&](const char* counts_name, const at::Tensor& counts,
                              const char* indices_name, const at::Tensor& indices) -> result<void> {
    const std::string cn = absl::StrCat(at, ".block.", counts_name);
    const std::string in = absl::StrCat(at, ".block.", indices_name);
    if (!counts.defined() || !indices.defined()) {
      return internal::invalid(
          kOp, absl::StrCat(cn, " and ", in, " must both be defined (or both undefined)"));
    }
    if (counts.scalar_type() != at::kInt || indices.scalar_type() != at::kInt) {
      return internal::invalid(
          kOp, absl::StrCat(cn, " has dtype ", keel::dtype_name(counts), " and ", in, " has dtype ",
                            keel::dtype_name(indices),
                            "; expected int32 for both (FlexAttention's BlockMask layout)"));
    }
    if (counts.dim() != 3 || !batch_heads_ok(counts, d) || counts.size(2) != qb) {
      return internal::invalid(
          kOp, absl::StrCat(cn, " has shape ", internal::shape_text(counts), "; expected [",
                            d.batch, " or 1, ", d.q_heads, " or 1, ", qb, "] (", qb,
                            " query blocks of ", bm.q_block_size, ")"));
    }
    if (indices.dim() != 4 || indices.size(0) != counts.size(0) ||
        indices.size(1) != counts.size(1) || indices.size(2) != qb) {
      return internal::invalid(
          kOp, absl::StrCat(in, " has shape ", internal::shape_text(indices), "; expected [",
                            counts.size(0), ", ", counts.size(1), ", ", qb, ", KVb]"));
    }
    result<void> dev = check_device(cn.c_str(), counts, q);
    if (!dev) return dev;
    dev = check_device(in.c_str(), indices, q);
    if (!dev) return dev;
    const std::int64_t slots = indices.size(3);
    if (counts.numel() > 0) {
      const auto lo = counts.min().item<std::int64_t>();
      const auto hi = counts.max().item<std::int64_t>();
      if (lo < 0 || hi > slots || hi > kvb) {
        return internal::invalid(
            kOp, absl::StrCat(cn, " holds counts in [", lo, ", ", hi, "]; expected [0, ",
                              std::min(slots, kvb), "] (", in, " has ", slots,
                              " slots, and there are ", kvb, " key blocks)"));
      }
    }
    if (indices.numel() > 0) {
      // Only the slots a count uses must be in range: FlexAttention pads the rest.
      const at::Tensor used =
          at::arange(slots, indices.options()).view({1, 1, 1, slots}) < counts.unsqueeze(-1);
      const at::Tensor bad = used & ((indices < 0) | (indices >= kvb));
      if (bad.any().item<bool>()) {
        const at::Tensor first = indices.masked_select(bad)[0];
        return internal::invalid(kOp,
                                 absl::StrCat(in, " holds index ", first.item<std::int64_t>(),
                                              "; expected key-block indices in [0, ", kvb, ")"));
      }
    }
    return success();
  };
  result<void> r = check_pair("kv_num_blocks", bm.kv_num_blocks, "kv_indices", bm.kv_indices);
  if (!r) return r;
  if (bm.full_kv_num_blocks.defined() || bm.full_kv_indices.defined()) {
    r = check_pair("full_kv_num_blocks", bm.full_kv_num_blocks, "full_kv_indices",
                   bm.full_kv_indices);
  }
  return r;
}

result<void> check_mask(const Mask& m, std::size_t index, const Dims& d, const at::Tensor& q) {
  const std::string at = absl::StrCat("spec.masks[", index, "]");
  switch (m.kind) {
    case MaskKind::causal:
      return success();
    case MaskKind::sliding_window:
      if (m.window_left < 0 || m.window_right < 0) {
        return internal::invalid(
            kOp, absl::StrCat(at, " is a sliding window of (left ", m.window_left, ", right ",
                              m.window_right, "); expected both >= 0"));
      }
      return success();
    case MaskKind::chunked_causal:
      if (m.chunk_size <= 0) {
        return internal::invalid(
            kOp, absl::StrCat(at, ".chunk_size is ", m.chunk_size, "; expected a chunk size > 0"));
      }
      return success();
    case MaskKind::prefix_lm:
      return check_index_tensor((at + ".prefix_lengths").c_str(), m.prefix_lengths, {d.batch},
                                "one prefix length per batch", q);
    case MaskKind::document: {
      result<void> r = check_index_tensor((at + ".q_document_ids").c_str(), m.q_document_ids,
                                          {d.batch, d.q_len}, "one document id per query token", q);
      if (!r) return r;
      return check_index_tensor((at + ".kv_document_ids").c_str(), m.kv_document_ids,
                                {d.batch, d.kv_len}, "one document id per key token", q);
    }
    case MaskKind::key_padding: {
      result<void> r = check_index_tensor((at + ".kv_lengths").c_str(), m.kv_lengths, {d.batch},
                                          "valid keys per batch", q);
      if (!r || m.kv_lengths.numel() == 0) return r;
      const auto lo = m.kv_lengths.min().item<std::int64_t>();
      const auto hi = m.kv_lengths.max().item<std::int64_t>();
      if (lo < 0 || hi > d.kv_len) {
        return internal::invalid(kOp,
                                 absl::StrCat(at, ".kv_lengths holds values in [", lo, ", ", hi,
                                              "]; expected each in [0, Lk = ", d.kv_len, "]"));
      }
      return r;
    }
    case MaskKind::block:
      return check_block_mask(at, m.block, d, q);
    case MaskKind::tensor: {
      const std::string name = at + ".tensor";
      if (!m.tensor.defined())
        return internal::invalid(kOp, name + " is undefined; expected a bool tensor");
      if (m.tensor.scalar_type() != at::kBool) {
        return internal::invalid(
            kOp, absl::StrCat(name, " has dtype ", keel::dtype_name(m.tensor),
                              "; expected bool (true keeps; pass an additive float mask "
                              "as spec.bias)"));
      }
      if (!internal::broadcasts_to(m.tensor, {d.batch, d.q_heads, d.q_len, d.kv_len})) {
        return internal::invalid(
            kOp, absl::StrCat(name, " has shape ", internal::shape_text(m.tensor),
                              ", which does not broadcast to [", d.batch, ", ", d.q_heads, ", ",
                              d.q_len, ", ", d.kv_len, "]"));
      }
      return check_device(name.c_str(), m.tensor, q);
    }
  }
  return internal::invalid(
      kOp, absl::StrCat(at, ".kind is ", static_cast<int>(m.kind), ", not a MaskKind"));
}

// The spec against the call's shapes; the resolved scale.
result<double> validate_spec(const at::Tensor& q, const AttentionSpec& spec, const Dims& d);

result<double> validate(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const AttentionSpec& spec) {
  const std::pair<const char*, const at::Tensor*> qkv[] = {
      {"query", &q}, {"key", &k}, {"value", &v}};
  for (const auto& [name, t] : qkv) {
    if (!t->defined()) return internal::invalid(kOp, absl::StrCat(name, " is an undefined tensor"));
    if (t->dim() != 4) {
      return internal::invalid(
          kOp, absl::StrCat(name, " has rank ", t->dim(), " (shape ", internal::shape_text(*t),
                            "); expected rank 4 [B, H, L, E]"));
    }
    if (!internal::is_supported_float(t->scalar_type())) {
      return internal::invalid(kOp, absl::StrCat(name, " has dtype ", keel::dtype_name(*t),
                                                 "; expected ", internal::kSupportedFloats));
    }
  }
  for (const auto& [name, t] : {qkv[1], qkv[2]}) {
    if (t->scalar_type() != q.scalar_type()) {
      return internal::invalid(
          kOp, absl::StrCat(name, " has dtype ", keel::dtype_name(*t), " but query has ",
                            keel::dtype_name(q), "; expected the same dtype"));
    }
    result<void> dev = check_device(name, *t, q);
    if (!dev) return dev.error();
  }
  const Dims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  if (k.size(0) != d.batch || v.size(0) != d.batch) {
    return internal::invalid(
        kOp, absl::StrCat("batch sizes differ: query ", d.batch, ", key ", k.size(0), ", value ",
                          v.size(0), "; expected equal"));
  }
  if (v.size(1) != d.kv_heads) {
    return internal::invalid(kOp, absl::StrCat("value has ", v.size(1), " heads but key has ",
                                               d.kv_heads, "; expected equal"));
  }
  if (d.kv_heads == 0 || d.q_heads % d.kv_heads != 0) {
    return internal::invalid(
        kOp, absl::StrCat("key has ", d.kv_heads, " heads, which does not divide the query's ",
                          d.q_heads, " (grouped-query attention needs Hq % Hkv == 0)"));
  }
  if (v.size(2) != d.kv_len) {
    return internal::invalid(kOp, absl::StrCat("value has sequence length ", v.size(2),
                                               " but key has ", d.kv_len, "; expected equal"));
  }
  if (k.size(3) != d.head_dim) {
    return internal::invalid(kOp, absl::StrCat("key has head dim ", k.size(3), " but query has ",
                                               d.head_dim, "; expected equal (E)"));
  }
  return validate_spec(q, spec, d);
}

result<double> validate_spec(const at::Tensor& q, const AttentionSpec& spec, const Dims& d) {
  if (!std::isfinite(spec.scale)) {
    return internal::invalid(
        kOp, absl::StrCat("spec.scale is ", spec.scale, "; expected a finite number"));
  }
  if (!std::isfinite(spec.softcap) || spec.softcap < 0) {
    return internal::invalid(
        kOp, absl::StrCat("spec.softcap is ", spec.softcap,
                          "; expected a finite value >= 0 (0 turns soft-capping off)"));
  }
  if (spec.combine != MaskCombine::all_of && spec.combine != MaskCombine::any_of) {
    return internal::invalid(kOp, absl::StrCat("spec.combine is ", static_cast<int>(spec.combine),
                                               ", not a MaskCombine"));
  }
  for (std::size_t i = 0; i < spec.masks.size(); ++i) {
    result<void> r = check_mask(spec.masks[i], i, d, q);
    if (!r) return r.error();
  }
  if (spec.alibi_slopes.defined()) {
    const at::Tensor& s = spec.alibi_slopes;
    if (!internal::is_supported_float(s.scalar_type()) || s.dim() != 1 || s.size(0) != d.q_heads) {
      return internal::invalid(
          kOp, absl::StrCat("spec.alibi_slopes has shape ", internal::shape_text(s), " and dtype ",
                            keel::dtype_name(s), "; expected a float tensor [", d.q_heads,
                            "] (one slope per query head)"));
    }
    result<void> dev = check_device("spec.alibi_slopes", s, q);
    if (!dev) return dev.error();
  }
  if (spec.bias.defined()) {
    const at::Tensor& b = spec.bias;
    if (b.scalar_type() != q.scalar_type()) {
      return internal::invalid(
          kOp, absl::StrCat("spec.bias has dtype ", keel::dtype_name(b), " but query has ",
                            keel::dtype_name(q), "; expected the same dtype"));
    }
    if (!internal::broadcasts_to(b, {d.batch, d.q_heads, d.q_len, d.kv_len})) {
      return internal::invalid(kOp, absl::StrCat("spec.bias has shape ", internal::shape_text(b),
                                                 ", which does not broadcast to [", d.batch, ", ",
                                                 d.q_heads, ", ", d.q_len, ", ", d.kv_len, "]"));
    }
    result<void> dev = check_device("spec.bias", b, q);
    if (!dev) return dev.error();
  }
  return spec.scale > 0 ? spec.scale : 1.0 / std::sqrt(static_cast<double>(d.head_dim));
}

// A tensor of exactly `rank` dims and an integer dtype, on the CPU or q's
// device (it is read on the host).
result<void> check_host_index(const char* name, const at::Tensor& t, std::int64_t rank,
                              const std::string& want, const at::Tensor& q) {
  if (!t.defined() || !is_integer(t.scalar_type()) || t.dim() != rank) {
    return internal::invalid(kOp, absl::StrCat(name, " is ",
                                               t.defined() ? absl::StrCat(keel::dtype_name(t), " ",
                                                                          internal::shape_text(t))
                                                           : std::string("undefined"),
                                               "; expected an integer tensor ", want));
  }
  if (!t.device().is_cpu() && t.device() != q.device()) {
    return internal::invalid(
        kOp, absl::StrCat(name, " is on ", t.device().str(),
                          "; expected the CPU or the query's device, ", q.device().str()));
  }
  return success();
}

// A paged call: the query and the pools as validate() checks q, k and v; the
// table and the lengths read on the host, so that no page id or length is
// used before it is checked; then the spec over the table's key positions.
result<double> validate_paged(const at::Tensor& q, const PagedKVCache& c,
                              const AttentionSpec& spec) {
  const std::pair<const char*, const at::Tensor*> tensors[] = {
      {"query", &q}, {"cache.k_pages", &c.k_pages}, {"cache.v_pages", &c.v_pages}};
  for (const auto& [name, t] : tensors) {
    if (!t->defined()) return internal::invalid(kOp, absl::StrCat(name, " is an undefined tensor"));
    if (t->dim() != 4) {
      return internal::invalid(
          kOp, absl::StrCat(name, " has rank ", t->dim(), " (shape ", internal::shape_text(*t),
                            "); expected rank 4 (query [B, Hq, Lq, E], pages [P, Hkv, "
                            "page_size, E])"));
    }
    if (t->scalar_type() != q.scalar_type() || !internal::is_supported_float(t->scalar_type())) {
      return internal::invalid(
          kOp, absl::StrCat(name, " has dtype ", keel::dtype_name(*t),
                            "; expected float16, bfloat16, float32 or float64, the same "
                            "for the query and both pools"));
    }
    result<void> dev = check_device(name, *t, q);
    if (!dev) return dev.error();
  }
  const at::Tensor& kp = c.k_pages;
  const at::Tensor& vp = c.v_pages;
  if (vp.size(0) != kp.size(0) || vp.size(1) != kp.size(1) || vp.size(2) != kp.size(2)) {
    return internal::invalid(kOp, absl::StrCat("cache.v_pages has shape ", internal::shape_text(vp),
                                               " and cache.k_pages ", internal::shape_text(kp),
                                               "; expected the same pages, heads and page size"));
  }
  const std::int64_t pages = kp.size(0);
  const std::int64_t page_size = kp.size(2);
  const Dims shape{q.size(0), q.size(1), kp.size(1), q.size(2), 0, q.size(3), vp.size(3)};
  if (page_size == 0) return internal::invalid(kOp, "cache.k_pages has page size 0; expected >= 1");
  if (shape.kv_heads == 0 || shape.q_heads % shape.kv_heads != 0) {
    return internal::invalid(
        kOp, absl::StrCat("cache.k_pages has ", shape.kv_heads,
                          " heads, which does not divide the query's ", shape.q_heads,
                          " (grouped-query attention needs Hq % Hkv == 0)"));
  }
  if (kp.size(3) != shape.head_dim) {
    return internal::invalid(
        kOp, absl::StrCat("cache.k_pages has head dim ", kp.size(3), " but query has ",
                          shape.head_dim, "; expected equal (E)"));
  }
  const std::string rows = absl::StrCat("[", shape.batch, ", max_pages]");
  result<void> ok = check_host_index("cache.page_table", c.page_table, 2, rows, q);
  if (ok && c.page_table.size(0) != shape.batch) {
    ok = internal::invalid(
        kOp, absl::StrCat("cache.page_table has shape ", internal::shape_text(c.page_table),
                          "; expected ", rows, " (one row per sequence)"));
  }
  if (ok)
    ok = check_host_index("cache.lengths", c.lengths, 1, absl::StrCat("[", shape.batch, "]"), q);
  if (ok && c.lengths.size(0) != shape.batch) {
    ok = internal::invalid(
        kOp, absl::StrCat("cache.lengths has shape ", internal::shape_text(c.lengths),
                          "; expected [", shape.batch, "] (one length per sequence)"));
  }
  if (!ok) return ok.error();
  const std::int64_t max_pages = c.page_table.size(1);
  if (max_pages > std::numeric_limits<std::int64_t>::max() / page_size) {
    return internal::invalid(kOp, absl::StrCat("cache.page_table lists ", max_pages, " pages of ",
                                               page_size, " keys, more keys than int64 counts"));
  }
  const std::int64_t logical_len = max_pages * page_size;
  const at::Tensor lengths = c.lengths.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor table = c.page_table.to(at::kCPU, at::kLong).contiguous();
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    const std::int64_t len = lengths.data_ptr<std::int64_t>()[b];
    if (len < 0 || len > logical_len) {
      return internal::invalid(
          kOp, absl::StrCat("cache.lengths[", b, "] is ", len, "; expected a length in [0, ",
                            logical_len, "] (", max_pages, " pages of ", page_size,
                            " keys in its row of cache.page_table)"));
    }
    const std::int64_t* ids = table.data_ptr<std::int64_t>() + b * max_pages;
    for (std::int64_t p = 0; p * page_size < len; ++p) {
      if (ids[p] < 0 || ids[p] >= pages) {
        return internal::invalid(
            kOp, absl::StrCat("cache.page_table[", b, "][", p, "] is ", ids[p],
                              "; expected a page id in [0, ", pages, ") (sequence ", b, " has ",
                              len, " keys, so it reads that page)"));
      }
    }
  }
  for (std::size_t i = 0; i < spec.masks.size(); ++i) {
    if (spec.masks[i].kind == MaskKind::block) {
      return internal::invalid(
          kOp, absl::StrCat("spec.masks[", i,
                            "] is a block mask, which a paged cache does not take (its "
                            "blocks index a contiguous cache); use position, document or "
                            "boolean mask terms"));
    }
  }
  if (at::GradMode::is_enabled() &&
      (q.requires_grad() || kp.requires_grad() || vp.requires_grad() ||
       (spec.bias.defined() && spec.bias.requires_grad()))) {
    return Error(Errc::unsupported,
                 "attention: a paged cache is an inference call, and autograd would have to "
                 "reach the query, the pages or spec.bias; call it under at::NoGradGuard, or "
                 "with tensors that do not require grad");
  }
  Dims d = shape;
  d.kv_len = logical_len;
  return validate_spec(q, spec, d);
}

// The spec with every position integer saturated where a larger value means
// nothing more, so that the kernels' position arithmetic cannot overflow: a
// window wider than Lq + Lk on a side sees every key there (a query sits at a
// position in [-Lq, Lk), a key in [0, Lk)), and a chunk longer than Lq + Lk
// holds every non-negative position. `Mask::sliding_window(INT64_MAX,
// INT64_MAX)` thus sees every key, as it says.
AttentionSpec saturated(const AttentionSpec& spec, std::int64_t q_len, std::int64_t kv_len) {
  const std::int64_t span = q_len + kv_len;
  AttentionSpec s = spec;
  for (Mask& m : s.masks) {
    m.window_left = std::min(m.window_left, span);
    m.window_right = std::min(m.window_right, span);
    m.chunk_size = std::min(m.chunk_size, span + 1);
  }
  return s;
}

// Validation (which reads tensors, as libtorch may fail to), the adapter's
// selection and its run, for a contiguous or a paged call.
template <class Validate>
result<AttentionOutput> dispatch(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const AttentionSpec& spec, std::int64_t kv_len,
                                 const PagedKVCache* paged, const Validate& validate_call) {
  const result<double> scale = [&]() -> result<double> {
    try {
      return validate_call();
    } catch (const std::exception& e) {
      return Error(Errc::backend_error,
                   absl::StrCat("attention: libtorch failed while validating: ", e.what()));
    }
  }();
  if (!scale) return scale.error();
  const AttentionSpec canonical = saturated(spec, q.size(2), kv_len);
  const internal::AttentionCall call{q, k, v, canonical, scale.value(), paged};
  auto ran = internal::dispatch_and_run(kOp, spec.dispatch, call, &internal::Adapter::attention);
  if (!ran) return ran.error();
  internal::AttentionResult& computed = ran.value().value;
  DispatchInfo info = std::move(ran.value().info);
  info.reason = absl::StrCat(info.reason, "; ", computed.path);
  info.attention = computed.route;
  return AttentionOutput{std::move(computed.out), std::move(computed.lse), std::move(info)};
}

}  // namespace

result<AttentionOutput> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const AttentionSpec& spec) {
  return dispatch(q, k, v, spec, k.defined() && k.dim() == 4 ? k.size(2) : 0, nullptr,
                  [&] { return validate(q, k, v, spec); });
}

result<AttentionOutput> attention(const at::Tensor& q, const PagedKVCache& cache,
                                  const AttentionSpec& spec) {
  // The table's key positions (saturation's span), 0 where validation is
  // going to refuse the shapes.
  std::int64_t logical_len = 0;
  if (cache.k_pages.defined() && cache.k_pages.dim() == 4 && cache.page_table.defined() &&
      cache.page_table.dim() == 2) {
    const std::int64_t page_size = cache.k_pages.size(2);
    const std::int64_t max_pages = cache.page_table.size(1);
    if (page_size > 0 && max_pages <= std::numeric_limits<std::int64_t>::max() / page_size) {
      logical_len = max_pages * page_size;
    }
  }
  return dispatch(q, cache.k_pages, cache.v_pages, spec, logical_len, &cache,
                  [&] { return validate_paged(q, cache, spec); });
}

}  // namespace v1
}  // namespace keel
