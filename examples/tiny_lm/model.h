// The tiny language model's arithmetic (examples/tiny_lm): its dimensions,
// parameter names, RMS norm and rotary positions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

namespace tiny_lm {

/// The model's dimensions (the defaults are the model tiny_lm trains).
struct Shape {
  std::int64_t dim = 96, layers = 3, q_heads = 4, kv_heads = 2, window = 32;
  [[nodiscard]] std::int64_t head_dim() const { return dim / q_heads; }
};

using Params = std::map<std::string, at::Tensor>;

inline std::string layer_name(std::int64_t l, const char* what) {
  return "layer" + std::to_string(l) + "/" + what;
}

inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& g) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * g;
}

/// Rotary angles of float `positions` `[T]` for head dim e: cos and sin
/// `[T, e/2]`.
inline std::pair<at::Tensor, at::Tensor> rope_angles(const at::Tensor& positions, std::int64_t e) {
  const std::int64_t half = e / 2;
  const at::Tensor inv = at::pow(10000.0, -at::arange(half, at::kFloat) * 2.0 / e);
  const at::Tensor angle = at::outer(positions, inv);
  return {angle.cos(), angle.sin()};
}

/// x `[..., E]` rotated by angles that broadcast to `[..., E/2]`.
inline at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const at::Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return at::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1);
}

}  // namespace tiny_lm
