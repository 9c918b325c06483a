#include "score_modifiers.h"

#include <ATen/ATen.h>

namespace keel::kernels {

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

}  // namespace keel::kernels
