#include "attention.h"

#include <string>

#include <ATen/DeviceGuard.h>
#include <absl/strings/str_cat.h>

#include "block_sparse_attention.h"
#include "decode_attention.h"
#include "dense_attention.h"

namespace keel::adapters {

namespace {

// A few queries against a cache (decode) go to compat::decode_attention;
// dense calls SDPA computes exactly to at::scaled_dot_product_attention; the
// rest to compat::block_sparse_attention. `path` says which, and why.
internal::AttentionResult compat_attention_route(const internal::AttentionCall& call) {
  // Both routes allocate on q's device: make it the current one (a no-op on
  // the CPU), as ATen's own ops do.
  const at::OptionalDeviceGuard device(at::device_of(call.q));
  internal::AttentionResult r;
  if (compat::decode_serves(call.q, call.k)) {
    compat::BlockSparseResult d =
        compat::decode_attention(call.q, call.k, call.v, call.spec, call.scale);
    r.out = std::move(d.out);
    if (call.spec.return_lse) r.lse = std::move(d.lse);
    r.path = absl::StrCat("ran compat::decode_attention (Lq <= ", compat::kDecodeMaxQueries,
                          ": each kv head read once for its query group, only the visible keys; "
                          "fraction of the cache read: ",
                          d.visible_fraction, ")");
    return r;
  }
  const std::string refusal = compat::sdpa_refusal(call.q, call.k, call.v, call.spec);
  if (refusal.empty()) {
    r.out = compat::sdpa_attention(call.q, call.k, call.v, call.spec, call.scale);
    r.path = "ran at::scaled_dot_product_attention (a dense call it computes exactly)";
    return r;
  }
  compat::BlockSparseResult b =
      compat::block_sparse_attention(call.q, call.k, call.v, call.spec, call.scale);
  r.out = std::move(b.out);
  if (call.spec.return_lse) r.lse = std::move(b.lse);
  const std::string engine =
      b.kernel_calls < 0
          ? std::string("its tile loop on ATen ops")
          : absl::StrCat(b.kernel_calls,
                         " call(s) of at::_scaled_dot_product_flash_attention_for_cpu");
  r.path = absl::StrCat("ran compat::block_sparse_attention (", engine, "), not SDPA, because ",
                        refusal, " (fraction of scores computed: ", b.visible_fraction, ")");
  return r;
}

class CompatAttention final : public internal::AttentionKernel {
 public:
  internal::Support supports(const internal::AttentionCall& /*call*/) const override {
    return internal::Support::yes();
  }
  internal::AttentionResult run(const internal::AttentionCall& call) const override {
    return compat_attention_route(call);
  }
};

}  // namespace

CapabilityInfo attention_capability() {
  CapabilityInfo c;
  c.operation = "attention";
  c.dtypes = {"float16", "bfloat16", "float32", "float64"};
  c.devices = {"cpu", "cuda"};
  c.features = {"causal (top-left, bottom-right)",
                "sliding window",
                "chunked causal",
                "prefix-LM",
                "document ids",
                "key padding",
                "block mask",
                "boolean mask",
                "and/or composition",
                "scale",
                "softcap",
                "ALiBi",
                "bias",
                "GQA/MQA",
                "decode (Lq <= 16)",
                "log-sum-exp",
                "autograd"};
  c.implementation =
      "compat::decode_attention for Lq <= 16 on the CPU (decode, speculative verification: each "
      "kv head read once for its query group, only the visible keys of each sequence, no copy "
      "of the cache); at::scaled_dot_product_attention for dense calls it computes exactly (no "
      "mask, causal, a "
      "boolean mask without empty rows, a finite bias without gradient; no softcap or lse); "
      "compat::block_sparse_attention otherwise: blocks of 128 classified from the mask spec, "
      "one call of at::_scaled_dot_product_flash_attention_for_cpu per contiguous range of "
      "visible key blocks (batched across query blocks; CPU, no score modifier, Ev == E), "
      "else a tile loop on plain ATen ops";
  return c;
}

const internal::AttentionKernel& compat_attention_kernel() {
  static const CompatAttention kernel;
  return kernel;
}

}  // namespace keel::adapters
