#include "compat/attention.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/DeviceGuard.h>
#include <absl/strings/str_cat.h>

#include "attention_mask.h"
#include "attention_route.h"
#include "block_sparse_attention.h"
#include "decode_attention.h"
#include "decode_policy.h"
#include "dense_attention.h"
#include "sequence_spec.h"

namespace keel::adapters {

namespace {

internal::AttentionResult contiguous_route(const internal::AttentionCall& call);

// A paged cache off the CPU: each sequence's pages gathered (index_select)
// into a contiguous cache of its own length, then the contiguous route.
internal::AttentionResult gathered_paged_route(const internal::AttentionCall& call) {
  const PagedKVCache& cache = *call.paged;
  const std::int64_t batch = call.q.size(0);
  const std::int64_t page_size = cache.k_pages.size(2);
  const at::Tensor table = cache.page_table.to(at::kCPU, at::kLong);
  const at::Tensor lengths = cache.lengths.to(at::kCPU, at::kLong);
  const std::int64_t logical_len = table.size(1) * page_size;
  const auto gather = [&](const at::Tensor& pool, const at::Tensor& ids, std::int64_t len) {
    // [n, Hkv, page, X] -> [1, Hkv, n * page, X], the first len keys.
    const at::Tensor pages = pool.index_select(0, ids.to(pool.device()));
    return pages.permute({1, 0, 2, 3})
        .reshape({1, pool.size(1), ids.numel() * page_size, pool.size(3)})
        .narrow(2, 0, len);
  };
  std::vector<at::Tensor> outs;
  std::vector<at::Tensor> lses;
  std::string path;
  AttentionDispatch route;
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto len = lengths[b].item<std::int64_t>();
    const at::Tensor ids = table[b].narrow(0, 0, kernels::block_count(len, page_size));
    const at::Tensor q = call.q.narrow(0, b, 1);
    const at::Tensor k = gather(cache.k_pages, ids, len);
    const at::Tensor v = gather(cache.v_pages, ids, len);
    const AttentionSpec spec = kernels::paged_sequence_spec(call.spec, b, batch, len, logical_len);
    internal::AttentionResult one = contiguous_route({q, k, v, spec, call.scale});
    outs.push_back(std::move(one.out));
    if (call.spec.return_lse) lses.push_back(std::move(one.lse));
    if (b == 0) path = std::move(one.path);
    if (b == 0) route = one.route;
  }
  internal::AttentionResult r;
  r.out = at::cat(outs, 0);
  if (call.spec.return_lse) r.lse = at::cat(lses, 0);
  r.path =
      absl::StrCat("gathered each sequence's pages (off the CPU), then, for sequence 0, ", path);
  r.route = route;
  r.route.route = AttentionRoute::gathered_paged;
  return r;
}

// Runs the kernel that kernels::attention_kernel (kernels/attention_route.h)
// chooses: a paged cache on kernels::paged_attention on the CPU (pages read
// where they lie), gathered per sequence elsewhere; on a contiguous cache, a
// few queries (decode) on kernels::decode_attention, dense calls SDPA
// computes exactly on at::scaled_dot_product_attention, the rest on
// kernels::block_sparse_attention. `path` says which, and why.
internal::AttentionResult compat_attention_route(const internal::AttentionCall& call) {
  // Every route allocates on q's device: make it the current one (a no-op on
  // the CPU), as ATen's own ops do.
  const at::OptionalDeviceGuard device(at::device_of(call.q));
  // Every input in the layout the kernels read (kernels::kernel_layout). A
  // paged cache's pools are read where they lie, at any strides: a copy
  // would cost the whole pool on every step.
  const at::Tensor q = kernels::kernel_layout(call.q);
  if (call.paged == nullptr) {
    const at::Tensor k = kernels::kernel_layout(call.k);
    const at::Tensor v = kernels::kernel_layout(call.v);
    return contiguous_route({q, k, v, call.spec, call.scale});
  }
  const internal::AttentionCall laid_out{q, call.k, call.v, call.spec, call.scale, call.paged};
  const kernels::KernelChoice choice = kernels::attention_kernel(
      q, call.paged->k_pages, call.paged->v_pages, call.spec, /*paged=*/true);
  if (choice.kernel == kernels::AttentionKernel::gathered_paged) {
    return gathered_paged_route(laid_out);
  }
  kernels::AttentionOutput d = kernels::paged_attention(q, *call.paged, call.spec, call.scale);
  internal::AttentionResult r;
  r.out = std::move(d.out);
  if (call.spec.return_lse) r.lse = std::move(d.lse);
  r.path = absl::StrCat(
      "ran kernels::paged_attention (pages read where they lie, a tile at a "
      "time; each kv head once per block of ",
      kernels::kDecodeMaxQueries,
      " queries; fraction of the sequences' keys read: ", d.visible_fraction, ")");
  r.route = {AttentionRoute::paged, -1, d.visible_fraction};
  return r;
}

internal::AttentionResult contiguous_route(const internal::AttentionCall& call) {
  internal::AttentionResult r;
  const kernels::KernelChoice choice =
      kernels::attention_kernel(call.q, call.k, call.v, call.spec, /*paged=*/false);
  if (choice.kernel == kernels::AttentionKernel::decode) {
    kernels::AttentionOutput d =
        kernels::decode_attention(call.q, call.k, call.v, call.spec, call.scale);
    r.out = std::move(d.out);
    if (call.spec.return_lse) r.lse = std::move(d.lse);
    r.path =
        absl::StrCat("ran kernels::decode_attention (decode, Lq <= ", kernels::kDecodeMaxQueries,
                     ", or chunked prefill, Lq < Lk <= ", kernels::kPrefillMaxQueries,
                     ": each kv head read once for its query group, only the visible keys; "
                     "fraction of the cache read per block of queries: ",
                     d.visible_fraction, ")");
    r.route = {AttentionRoute::decode, -1, d.visible_fraction};
    return r;
  }
  if (choice.kernel == kernels::AttentionKernel::dense) {
    r.out = kernels::sdpa_attention(call.q, call.k, call.v, call.spec, call.scale);
    r.path = "ran at::scaled_dot_product_attention (a dense call it computes exactly)";
    r.route = {AttentionRoute::dense, -1, 1.0};
    return r;
  }
  kernels::AttentionOutput b =
      kernels::block_sparse_attention(call.q, call.k, call.v, call.spec, call.scale);
  r.out = std::move(b.out);
  if (call.spec.return_lse) r.lse = std::move(b.lse);
  const std::string engine =
      b.kernel_calls < 0
          ? std::string("its tile loop on ATen ops")
          : absl::StrCat(b.kernel_calls,
                         " call(s) of at::_scaled_dot_product_flash_attention_for_cpu");
  r.path = absl::StrCat("ran kernels::block_sparse_attention (", engine, "), not SDPA, because ",
                        choice.refusal, " (fraction of scores computed: ", b.visible_fraction, ")");
  r.route = {AttentionRoute::block_sparse, b.kernel_calls, b.visible_fraction};
  return r;
}

internal::Capability attention_capability() {
  return internal::Capability::floating(
      "attention",
      {"causal (top-left, bottom-right)", "sliding window", "chunked causal", "prefix-LM",
       "document ids", "key padding", "block mask", "boolean mask", "and/or composition", "scale",
       "softcap", "ALiBi", "bias", "GQA/MQA",
       absl::StrCat("decode (Lq <= ", kernels::kDecodeMaxQueries, ") and chunked prefill"),
       "paged KV cache (inference)", "log-sum-exp", "autograd"},
      absl::StrCat(
          "inputs whose last dimension is strided are copied contiguous first, any other layout "
          "is read in place; "
          "kernels::paged_attention for a paged cache on the CPU (pages read in place through a "
          "bounded tile; gathered per sequence on other devices); "
          "kernels::decode_attention on the CPU for Lq <= ",
          kernels::kDecodeMaxQueries,
          " (decode, speculative verification) and chunked prefill (Lq < Lk, Lq <= ",
          kernels::kPrefillMaxQueries,
          ", no score modifier): each kv head read once for its query group, only the visible keys "
          "of each sequence, no copy of the cache, on "
          "at::_scaled_dot_product_flash_attention_for_cpu with the group's queries as rows where "
          "it "
          "serves, keel's products otherwise; at::scaled_dot_product_attention for dense calls it "
          "computes exactly (no mask, causal, a boolean mask without empty rows, a finite bias "
          "without "
          "gradient; no softcap or lse); "
          "kernels::block_sparse_attention otherwise: blocks of 128 classified from the mask spec, "
          "one call of at::_scaled_dot_product_flash_attention_for_cpu per contiguous range of "
          "visible key blocks (batched across query blocks; CPU, no score modifier, Ev == E), "
          "else a tile loop on plain ATen ops"));
}

class CompatAttention final : public internal::AttentionKernel {
 public:
  const internal::Capability& capability() const noexcept override {
    static const internal::Capability kCapability = attention_capability();
    return kCapability;
  }
  internal::AttentionResult run(const internal::AttentionCall& call) const override {
    return compat_attention_route(call);
  }
};

}  // namespace

const internal::AttentionKernel& compat_attention_kernel() {
  static const CompatAttention kernel;
  return kernel;
}

}  // namespace keel::adapters
