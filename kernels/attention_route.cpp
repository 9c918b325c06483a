#include "attention_route.h"

#include <limits>
#include <utility>

#include <c10/core/GradMode.h>

#include "decode_policy.h"
#include "dense_attention.h"
#include "fused_decode.h"

namespace keel::kernels {

namespace {

bool on_graph(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return at::GradMode::is_enabled() &&
         (q.requires_grad() || k.requires_grad() || v.requires_grad());
}

// Whether libtorch's CPU flash kernel can serve blocks of this call over a
// contiguous cache: no score modifier (the kernel adds none), Ev == E,
// 16-bit or float32 inputs (float64 keeps keel's own products), not empty
// (the kernel divides by its sizes). libtorch's derivative of the kernel
// drops the gradient of its lse, so a call whose lse autograd must reach
// keeps keel's products.
bool flash_serves(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const AttentionSpec& spec) {
  const bool lse_on_graph = spec.return_lse && on_graph(q, k, v);
  const bool empty = q.numel() == 0 || k.numel() == 0 || v.numel() == 0;
  return spec.softcap == 0 && !spec.alibi_slopes.defined() && !spec.bias.defined() &&
         v.size(3) == q.size(3) && q.scalar_type() != at::kDouble && !lse_on_graph && !empty;
}

// Whether the decode kernel serves a contiguous call: CPU tensors, Lk >= 1,
// and either 1 <= Lq <= kDecodeMaxQueries, or a chunked prefill (Lq < Lk,
// Lq <= kPrefillMaxQueries) that the flash kernel can compute.
bool decode_serves(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const AttentionSpec& spec) {
  const std::int64_t q_len = q.size(2);
  const std::int64_t kv_len = k.size(2);
  if (!q.device().is_cpu() || q_len < 1 || kv_len < 1) return false;
  if (q_len <= kDecodeMaxQueries) return true;
  return q_len < kv_len && q_len <= kPrefillMaxQueries && flash_serves(q, k, v, spec);
}

// The most visible keys of one block for which the fused kernel serves the
// call's `rows` queries per query head, 0 when it serves none: float32 or
// bfloat16 q, k and v, no score modifier, rows of adjacent elements in the
// cache, off the autograd graph, up to kFusedMaxRows rows per kv head; a
// float32 contiguous cache past kFusedContiguousRowsF32 rows only over
// kFusedShortKeysF32 keys.
std::int64_t fused_keys(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const AttentionSpec& spec, std::int64_t group, std::int64_t rows,
                        bool paged) {
  const at::ScalarType dtype = q.scalar_type();
  const bool serves = (dtype == at::kFloat || dtype == at::kBFloat16) && k.scalar_type() == dtype &&
                      v.scalar_type() == dtype && !on_graph(q, k, v) && spec.softcap == 0 &&
                      !spec.alibi_slopes.defined() && !spec.bias.defined() &&
                      group * rows <= kFusedMaxRows && k.stride(3) == 1 && v.stride(3) == 1 &&
                      fused_decode_runs_here(q.size(3), v.size(3));
  if (!serves) return 0;
  const bool gemms_faster = !paged && dtype == at::kFloat && group * rows > kFusedContiguousRowsF32;
  return gemms_faster ? kFusedShortKeysF32 : std::numeric_limits<std::int64_t>::max();
}

}  // namespace

at::Tensor kernel_layout(const at::Tensor& t) {
  if (!t.defined() || t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1) return t;
  return t.contiguous();
}

KernelChoice attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const AttentionSpec& spec, bool paged) {
  if (paged) {
    return {q.device().is_cpu() ? AttentionKernel::paged : AttentionKernel::gathered_paged, {}};
  }
  if (decode_serves(q, k, v, spec)) return {AttentionKernel::decode, {}};
  std::string refusal = sdpa_refusal(q, k, v, spec);
  if (refusal.empty()) return {AttentionKernel::dense, {}};
  return {AttentionKernel::block_sparse, std::move(refusal)};
}

bool block_sparse_on_flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionSpec& spec) {
  return q.device().is_cpu() && q.size(2) > 0 && k.size(2) > 0 && v.size(3) == q.size(3) &&
         spec.softcap == 0 && !spec.alibi_slopes.defined() && !spec.bias.defined();
}

DecodeRoutes decode_routes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionSpec& spec, std::int64_t group, bool paged) {
  DecodeRoutes r;
  const std::int64_t q_len = q.size(2);
  r.fused_keys_most = fused_keys(q, k, v, spec, group, q_len, paged);
  r.flash = !paged && flash_serves(q, k, v, spec);
  r.block_rows = r.fused_keys_most > 0 ? q_len : (r.flash ? kFlashQueryRows : kDecodeMaxQueries);
  return r;
}

bool flash_heads_layout(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        std::int64_t group, std::int64_t rows, std::int64_t keys) {
  return q.scalar_type() != at::kFloat && group * rows < kHeadsLayoutRows &&
         keys * (k.size(3) + v.size(3)) * static_cast<std::int64_t>(k.element_size()) <=
             kHeadsLayoutBytes;
}

bool flash_splits(std::int64_t q_len, const KeyRange& range, bool grad) {
  // Decode (Lq <= kDecodeMaxQueries) keeps one call: its mask is small.
  const std::int64_t inner = range.inner_hi - range.inner_lo;
  return q_len > kDecodeMaxQueries && !range.full && !grad &&
         inner >= kFlashSplitRatio * (range.hi - range.lo - inner);
}

}  // namespace keel::kernels
