// keel::attention over packed ragged queries (include/keel/v1/attention.h):
// a serving step's sequences, each with its own query count, against a paged
// cache, and the varlen layout of training without padding.
//
// The offsets are checked on the host before any row is read. On a paged
// cache, the sequences are grouped by query count (a step's decodes, its
// speculative verifications, each prefill chunk length) and each group is
// one batched paged call on its rows of the page table (the plan of a
// padded batch, without the padding), its rows written back in place. The
// varlen layout runs each sequence as its own call, through autograd. Every
// per-sequence tensor of the spec is cut to the sequence or group, so a
// mask means per sequence what it means in a single call.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>

#include "keel/v1/attention.h"
#include "validate.h"

namespace keel {
inline namespace v1 {
namespace {

constexpr const char* kOp = "attention";

// The offsets of `name` ([B + 1], integer, on the CPU: 0, non-decreasing,
// ending at `total`), read on the host.
result<std::vector<std::int64_t>> offsets(const char* name, const at::Tensor& cu,
                                          std::int64_t total, const char* total_name) {
  if (!cu.defined() || cu.dim() != 1 || cu.size(0) < 1 ||
      !(at::isIntegralType(cu.scalar_type(), /*includeBool=*/false))) {
    return internal::invalid(
        kOp, absl::StrCat(name, " is ",
                          cu.defined() ? absl::StrCat(c10::toString(cu.scalar_type()), " ",
                                                      internal::shape_text(cu))
                                       : std::string("undefined"),
                          "; expected an integer tensor [B + 1] of offsets"));
  }
  if (!cu.device().is_cpu()) {
    return internal::invalid(kOp,
                             absl::StrCat(name, " is on ", cu.device().str(),
                                          "; expected the CPU (offsets are read on the host)"));
  }
  const at::Tensor c = cu.to(at::kLong).contiguous();
  std::vector<std::int64_t> v(c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel());
  if (v.front() != 0) {
    return internal::invalid(kOp, absl::StrCat(name, "[0] is ", v.front(), "; expected 0"));
  }
  for (std::size_t i = 1; i < v.size(); ++i) {
    if (v[i] < v[i - 1]) {
      return internal::invalid(
          kOp, absl::StrCat(name, "[", i, "] is ", v[i], ", less than ", name, "[", i - 1,
                            "] = ", v[i - 1], "; offsets must not decrease"));
    }
  }
  if (v.back() != total) {
    return internal::invalid(kOp, absl::StrCat(name, "[", v.size() - 1, "] is ", v.back(),
                                               "; expected ", total, ", ", total_name));
  }
  return v;
}

result<void> check_rank3(const char* name, const at::Tensor& t, const char* layout) {
  if (!t.defined() || t.dim() != 3) {
    return internal::invalid(
        kOp, absl::StrCat(name, " is ", t.defined() ? internal::shape_text(t) : "undefined",
                          "; expected rank 3, ", layout));
  }
  return success();
}

// Terms whose tensors have a padded-batch layout with no packed form.
result<void> check_packable(const AttentionSpec& spec) {
  for (std::size_t i = 0; i < spec.masks.size(); ++i) {
    const MaskKind kind = spec.masks[i].kind;
    if (kind == MaskKind::block || kind == MaskKind::tensor) {
      return internal::invalid(
          kOp, absl::StrCat("spec.masks[", i, "] is a ",
                            kind == MaskKind::block ? "block mask" : "boolean mask tensor",
                            ", whose [B, H, Lq, Lk] layout has no packed form; packed queries "
                            "take position, document, prefix and key-padding terms"));
    }
  }
  if (spec.bias.defined()) {
    return internal::invalid(kOp,
                             "spec.bias has a [B, H, Lq, Lk] layout, which has no packed form; "
                             "packed queries take masks, softcap and ALiBi");
  }
  return success();
}

// Sequence b's spec: per-sequence tensors cut to it. q_document_ids is
// packed [T] (rows [q0, q0 + lq)); kv_document_ids is [B, keys] for a paged
// cache or packed [S] (keys [k0, k0 + lk)) for packed keys.
AttentionSpec sequence_spec(const AttentionSpec& spec, std::int64_t b, std::int64_t q0,
                            std::int64_t lq, bool packed_keys, std::int64_t k0, std::int64_t lk) {
  AttentionSpec s = spec;
  for (Mask& m : s.masks) {
    if (m.prefix_lengths.defined()) m.prefix_lengths = m.prefix_lengths.narrow(0, b, 1);
    if (m.kv_lengths.defined()) m.kv_lengths = m.kv_lengths.narrow(0, b, 1);
    if (m.q_document_ids.defined())
      m.q_document_ids = m.q_document_ids.narrow(0, q0, lq).unsqueeze(0);
    if (m.kv_document_ids.defined()) {
      m.kv_document_ids = packed_keys ? m.kv_document_ids.narrow(0, k0, lk).unsqueeze(0)
                                      : m.kv_document_ids.narrow(0, b, 1);
    }
  }
  return s;
}

// A group's spec (the sequences `members`, their query rows `rows`): the
// per-sequence tensors cut to them, q_document_ids still packed.
AttentionSpec group_spec(const AttentionSpec& spec, const std::vector<std::int64_t>& members,
                         const at::Tensor& rows) {
  AttentionSpec s = spec;
  const at::Tensor idx = at::tensor(members, at::kLong);
  auto pick = [&](const at::Tensor& t) { return t.index_select(0, idx.to(t.device())); };
  for (Mask& m : s.masks) {
    if (m.prefix_lengths.defined()) m.prefix_lengths = pick(m.prefix_lengths);
    if (m.kv_lengths.defined()) m.kv_lengths = pick(m.kv_lengths);
    if (m.kv_document_ids.defined()) m.kv_document_ids = pick(m.kv_document_ids);
    if (m.q_document_ids.defined()) {
      m.q_document_ids = m.q_document_ids.index_select(0, rows.to(m.q_document_ids.device()));
    }
  }
  return s;
}

result<void> check_packed_terms(const AttentionSpec& spec, std::int64_t batch, std::int64_t total_q,
                                bool packed_keys, std::int64_t total_k) {
  for (std::size_t i = 0; i < spec.masks.size(); ++i) {
    const Mask& m = spec.masks[i];
    const auto want = [&](const char* field, const at::Tensor& t, std::int64_t rows,
                          bool one_dim) -> result<void> {
      if (!t.defined()) return success();
      if ((one_dim && t.dim() != 1) || t.dim() < 1 || t.size(0) != rows) {
        return internal::invalid(
            kOp, absl::StrCat("spec.masks[", i, "].", field, " is ", internal::shape_text(t),
                              "; packed queries expect [", rows, one_dim ? "]" : ", ...]"));
      }
      return success();
    };
    for (const auto& r :
         {want("prefix_lengths", m.prefix_lengths, batch, true),
          want("kv_lengths", m.kv_lengths, batch, true),
          want("q_document_ids", m.q_document_ids, total_q, true),
          want("kv_document_ids", m.kv_document_ids, packed_keys ? total_k : batch, packed_keys)}) {
      if (!r) return r.error();
    }
  }
  return success();
}

// Assembles per-sequence results into [T, Hq, Ev] and [T, Hq].
struct Assembly {
  std::vector<at::Tensor> outs, lses;
  DispatchInfo dispatch;
};

result<AttentionOutput> finish(Assembly& a, const at::Tensor& q, std::int64_t ev, bool lse) {
  AttentionOutput r;
  const std::int64_t hq = q.size(1);
  r.out = a.outs.empty() ? at::zeros({0, hq, ev}, q.options().requires_grad(false))
                         : at::cat(a.outs, 0);
  if (lse) {
    const auto lse_type = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    r.lse = a.lses.empty() ? at::zeros({0, hq}, q.options().dtype(lse_type)) : at::cat(a.lses, 0);
  }
  r.dispatch = std::move(a.dispatch);
  return r;
}

// Runs sequence by sequence: `one(b, q_b)` is the single call of sequence b
// on its queries [1, Hq, Lq_b, E].
template <class One>
result<AttentionOutput> per_sequence(const at::Tensor& q, const std::vector<std::int64_t>& cu,
                                     std::int64_t ev, bool lse, const One& one) {
  Assembly a;
  for (std::size_t b = 0; b + 1 < cu.size(); ++b) {
    const std::int64_t lq = cu[b + 1] - cu[b];
    if (lq == 0) continue;
    const at::Tensor qb = q.narrow(0, cu[b], lq).transpose(0, 1).unsqueeze(0);
    result<AttentionOutput> r = one(static_cast<std::int64_t>(b), qb);
    if (!r) return r.error();
    a.outs.push_back(r.value().out.squeeze(0).transpose(0, 1));
    if (lse) a.lses.push_back(r.value().lse.squeeze(0).transpose(0, 1));
    a.dispatch = std::move(r.value().dispatch);
  }
  return finish(a, q, ev, lse);
}

}  // namespace

result<AttentionOutput> attention(const PackedQueries& packed, const PagedKVCache& cache,
                                  const AttentionSpec& spec) {
  const at::Tensor& q = packed.q;
  result<void> ok = check_rank3("q.q", q, "[T, Hq, E]");
  if (!ok) return ok.error();
  if (!cache.page_table.defined() || cache.page_table.dim() != 2) {
    return internal::invalid(kOp, "cache.page_table is not a [B, max_pages] tensor");
  }
  if (!cache.v_pages.defined() || cache.v_pages.dim() != 4) {
    return internal::invalid(kOp, "cache.v_pages is not a [P, Hkv, page_size, Ev] tensor");
  }
  const std::int64_t batch = cache.page_table.size(0);
  result<std::vector<std::int64_t>> cu =
      offsets("q.cu_seqlens_q", packed.cu_seqlens_q, q.size(0), "q's T (rows)");
  if (!cu) return cu.error();
  if (static_cast<std::int64_t>(cu.value().size()) != batch + 1) {
    return internal::invalid(
        kOp, absl::StrCat("q.cu_seqlens_q has ", cu.value().size(), " offsets for ", batch,
                          " sequences (cache.page_table's rows); expected ", batch + 1));
  }
  ok = check_packable(spec);
  if (ok) ok = check_packed_terms(spec, batch, q.size(0), /*packed_keys=*/false, 0);
  if (!ok) return ok.error();
  const std::vector<std::int64_t>& c = cu.value();
  const std::int64_t ev = cache.v_pages.size(3), hq = q.size(1), e = q.size(2);
  // Sequences grouped by query count (a step's decodes, its speculative
  // verifications, each prefill chunk length): one batched call per group,
  // on the group's rows of the page table. A group of every sequence reads
  // q in place.
  std::map<std::int64_t, std::vector<std::int64_t>> groups;
  for (std::int64_t b = 0; b < batch; ++b) {
    if (c[b + 1] > c[b]) groups[c[b + 1] - c[b]].push_back(b);
  }
  const bool whole =
      groups.size() == 1 && static_cast<std::int64_t>(groups.begin()->second.size()) == batch;
  const bool lengths_per_row =
      cache.lengths.defined() && cache.lengths.dim() == 1 && cache.lengths.size(0) == batch;
  Assembly a;
  at::Tensor out, lse;
  for (const auto& [lq, members] : groups) {
    const auto g = static_cast<std::int64_t>(members.size());
    std::vector<std::int64_t> row_ids;
    row_ids.reserve(static_cast<std::size_t>(g * lq));
    for (std::int64_t b : members) {
      for (std::int64_t i = c[b]; i < c[b + 1]; ++i) row_ids.push_back(i);
    }
    const at::Tensor rows = at::tensor(row_ids, at::kLong).to(q.device());
    const at::Tensor qg = whole ? q : q.index_select(0, rows);
    AttentionSpec s = whole ? spec : group_spec(spec, members, rows);
    for (Mask& m : s.masks) {
      if (m.q_document_ids.defined()) m.q_document_ids = m.q_document_ids.reshape({g, lq});
    }
    PagedKVCache part = cache;
    if (!whole) {
      const at::Tensor idx = at::tensor(members, at::kLong);
      part.page_table = cache.page_table.index_select(0, idx.to(cache.page_table.device()));
      if (lengths_per_row) {
        part.lengths = cache.lengths.index_select(0, idx.to(cache.lengths.device()));
      }
    }
    result<AttentionOutput> r =
        attention(qg.reshape({g, lq, hq, e}).transpose(1, 2).contiguous(), part, s);
    if (!r) return r.error();
    AttentionOutput& o = r.value();
    at::Tensor og = o.out.transpose(1, 2).reshape({g * lq, hq, ev});
    at::Tensor lg = o.lse.defined() ? o.lse.transpose(1, 2).reshape({g * lq, hq}) : o.lse;
    if (whole) {
      o.out = og;
      o.lse = lg;
      return r;
    }
    if (!out.defined()) {
      out = at::zeros({q.size(0), hq, ev}, og.options());
      if (lg.defined()) lse = at::full({q.size(0), hq}, -INFINITY, lg.options());
    }
    out.index_copy_(0, rows, og);
    if (lg.defined()) lse.index_copy_(0, rows, lg);
    a.dispatch = std::move(o.dispatch);
  }
  if (!out.defined()) return finish(a, q, ev, spec.return_lse);
  AttentionOutput r;
  r.out = std::move(out);
  r.lse = std::move(lse);
  r.dispatch = std::move(a.dispatch);
  return r;
}

result<AttentionOutput> attention(const PackedQueries& packed, const PackedKeys& kv,
                                  const AttentionSpec& spec) {
  const at::Tensor& q = packed.q;
  result<void> ok = check_rank3("q.q", q, "[T, Hq, E]");
  if (ok) ok = check_rank3("kv.k", kv.k, "[S, Hkv, E]");
  if (ok) ok = check_rank3("kv.v", kv.v, "[S, Hkv, Ev]");
  if (!ok) return ok.error();
  result<std::vector<std::int64_t>> cu =
      offsets("q.cu_seqlens_q", packed.cu_seqlens_q, q.size(0), "q's T (rows)");
  if (!cu) return cu.error();
  result<std::vector<std::int64_t>> cuk =
      offsets("kv.cu_seqlens_k", kv.cu_seqlens_k, kv.k.size(0), "kv.k's S (rows)");
  if (!cuk) return cuk.error();
  if (cu.value().size() != cuk.value().size()) {
    return internal::invalid(
        kOp, absl::StrCat("q.cu_seqlens_q has ", cu.value().size(), " offsets and kv.cu_seqlens_k ",
                          cuk.value().size(), "; expected one sequence count"));
  }
  if (kv.v.size(0) != kv.k.size(0)) {
    return internal::invalid(kOp, absl::StrCat("kv.v has ", kv.v.size(0), " rows and kv.k ",
                                               kv.k.size(0), "; expected the same"));
  }
  const auto batch = static_cast<std::int64_t>(cu.value().size()) - 1;
  ok = check_packable(spec);
  if (ok) ok = check_packed_terms(spec, batch, q.size(0), /*packed_keys=*/true, kv.k.size(0));
  if (!ok) return ok.error();
  const std::vector<std::int64_t>& c = cu.value();
  const std::vector<std::int64_t>& ck = cuk.value();
  return per_sequence(
      q, c, kv.v.size(2), spec.return_lse, [&](std::int64_t b, const at::Tensor& qb) {
        const std::int64_t lk = ck[b + 1] - ck[b];
        const at::Tensor kb = kv.k.narrow(0, ck[b], lk).transpose(0, 1).unsqueeze(0);
        const at::Tensor vb = kv.v.narrow(0, ck[b], lk).transpose(0, 1).unsqueeze(0);
        return attention(qb, kb, vb,
                         sequence_spec(spec, b, c[b], c[b + 1] - c[b], true, ck[b], lk));
      });
}

}  // namespace v1
}  // namespace keel
