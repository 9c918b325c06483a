#include "dense_attention.h"

#include <limits>
#include <optional>

#include <ATen/ATen.h>

#include "attention_mask.h"
#include "score_modifiers.h"

namespace keel::kernels {

namespace {

bool is_plain_causal(const AttentionSpec& spec, const at::Tensor& q, const at::Tensor& k) {
  if (spec.masks.size() != 1 || spec.masks[0].kind != MaskKind::causal) return false;
  // SDPA's is_causal is top-left; bottom-right is the same when Lq == Lk.
  return spec.masks[0].alignment == CausalAlignment::top_left || q.size(2) == k.size(2);
}

}  // namespace

std::string sdpa_refusal(const at::Tensor& q, const at::Tensor& k, const at::Tensor& /*v*/,
                         const AttentionSpec& spec) {
  if (spec.return_lse) return "SDPA returns no log-sum-exp";
  if (spec.softcap > 0) return "SDPA has no soft-capping";
  if (q.size(2) == 0 || k.size(2) == 0) return "an empty sequence";
  if (spec.bias.defined()) {
    // SDPA's fused CPU kernel does not differentiate its mask, and a -inf
    // bias may empty a row, which SDPA turns into NaN.
    if (spec.bias.requires_grad()) return "the bias needs a gradient";
    if (!spec.bias.isfinite().all().item<bool>()) return "the bias holds non-finite values";
  }
  if (spec.alibi_slopes.defined() && q.scalar_type() != at::kFloat &&
      q.scalar_type() != at::kDouble) {
    return "ALiBi distances would round in a half-precision additive mask";
  }
  if (spec.masks.empty() || is_plain_causal(spec, q, k)) return {};
  if (spec.masks.size() == 1 && spec.masks[0].kind == MaskKind::tensor) {
    // SDPA gives NaN on a row with no visible key; keel promises 0.
    if (!spec.masks[0].tensor.any(-1).all().item<bool>()) return "the mask has a fully masked row";
    return {};
  }
  return "the mask is structured (the block-sparse kernel skips the blocks it hides)";
}

at::Tensor sdpa_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionSpec& spec, double scale) {
  const bool causal = is_plain_causal(spec, q, k);
  const bool gqa = q.size(1) != k.size(1);
  const bool additive = spec.bias.defined() || spec.alibi_slopes.defined();
  std::optional<at::Tensor> mask;
  if (!additive) {
    if (!spec.masks.empty() && !causal) mask = spec.masks[0].tensor;
    return at::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale, gqa);
  }
  // ALiBi and the bias fold into one additive float mask; a boolean mask
  // (or causal, which SDPA does not take beside a mask) becomes -inf there.
  const std::int64_t q_len = q.size(2);
  const std::int64_t kv_len = k.size(2);
  const at::Tensor keys = at::arange(kv_len, q.options().dtype(at::kLong));
  at::Tensor add = add_score_modifiers(at::zeros({1, 1, q_len, kv_len}, q.options()), spec, 0,
                                       q_len, keys, q_len, kv_len);
  if (!spec.masks.empty()) {
    const MaskGeometry g{q.size(0), q.size(1), q_len, kv_len};
    add = add.masked_fill(materialize_mask(spec, g, q.device()).logical_not(),
                          -std::numeric_limits<double>::infinity());
  }
  return at::scaled_dot_product_attention(q, k, v, add, 0.0, false, scale, gqa);
}

}  // namespace keel::kernels
