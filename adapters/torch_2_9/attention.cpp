#include "attention.h"

#include <string>

#include <ATen/DeviceGuard.h>
#include <absl/strings/str_cat.h>

#include "block_sparse_attention.h"
#include "dense_attention.h"

namespace keel::adapters {

namespace {

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

internal::AttentionResult compat_attention_route(const internal::AttentionCall& call) {
  // Both routes allocate on q's device: make it the current one (a no-op on
  // the CPU), as ATen's own ops do.
  const at::OptionalDeviceGuard device(at::device_of(call.q));
  const std::string refusal = compat::sdpa_refusal(call.q, call.k, call.v, call.spec);
  internal::AttentionResult r;
  if (refusal.empty()) {
    r.out = compat::sdpa_attention(call.q, call.k, call.v, call.spec, call.scale);
    r.path = "ran at::scaled_dot_product_attention (a dense call it computes exactly)";
    return r;
  }
  compat::BlockSparseResult b =
      compat::block_sparse_attention(call.q, call.k, call.v, call.spec, call.scale);
  r.out = std::move(b.out);
  if (call.spec.return_lse) r.lse = std::move(b.lse);
  r.path = absl::StrCat("ran compat::block_sparse_attention, not SDPA, because ", refusal,
                        " (visible blocks: ", b.visible_fraction, ")");
  return r;
}

const internal::AttentionKernel& compat_attention_kernel() {
  static const CompatAttention kernel;
  return kernel;
}

}  // namespace keel::adapters
