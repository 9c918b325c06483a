// The tiny language model's arithmetic, shared by examples/tiny_lm (which
// trains it) and examples/serve (which serves it from a paged cache): the
// parameter names, RMS norm, rotary positions, and the weights file that
// carries a trained model and its vocabulary from one to the other.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

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

/// A trained model as examples/serve loads it.
struct Weights {
  Shape shape;
  Params params;
  std::vector<unsigned char> byte_of;  // token id -> the character it stands for
};

/// Writes the weights (libtorch's pickle of a dict of tensors).
inline void save_weights(const std::string& path, const Weights& w) {
  c10::Dict<std::string, at::Tensor> d;
  for (const auto& [name, t] : w.params) d.insert("param/" + name, t.detach().contiguous());
  d.insert("shape",
           at::tensor(std::vector<std::int64_t>{w.shape.dim, w.shape.layers, w.shape.q_heads,
                                                w.shape.kv_heads, w.shape.window}));
  d.insert("vocabulary", at::tensor(std::vector<std::uint8_t>(w.byte_of.begin(), w.byte_of.end())));
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(d));
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot write " + path);
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("cannot write " + path);
}

/// Reads what save_weights wrote; nullopt with `*error` set when the file is
/// missing or not a tiny_lm model.
inline std::optional<Weights> load_weights(const std::string& path, std::string* error) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    *error = "cannot open " + path;
    return std::nullopt;
  }
  std::vector<char> bytes;
  char buf[1 << 16];
  for (std::size_t n = 0; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) {
    bytes.insert(bytes.end(), buf, buf + n);
  }
  std::fclose(f);
  try {
    const c10::IValue v = torch::jit::pickle_load(bytes);
    if (!v.isGenericDict()) throw std::runtime_error("not a dict");
    Weights w;
    for (const auto& item : v.toGenericDict()) {
      const std::string name = item.key().toStringRef();
      const at::Tensor t = item.value().toTensor();
      if (name.rfind("param/", 0) == 0) {
        w.params[name.substr(6)] = t;
      } else if (name == "shape" && t.numel() == 5) {
        const at::Tensor s = t.to(at::kLong);
        w.shape = {s[0].item<std::int64_t>(), s[1].item<std::int64_t>(), s[2].item<std::int64_t>(),
                   s[3].item<std::int64_t>(), s[4].item<std::int64_t>()};
      } else if (name == "vocabulary") {
        const at::Tensor b = t.to(at::kByte).contiguous();
        w.byte_of.assign(b.data_ptr<std::uint8_t>(), b.data_ptr<std::uint8_t>() + b.numel());
      }
    }
    const Shape& s = w.shape;
    const bool shape_ok = s.dim > 0 && s.layers > 0 && s.q_heads > 0 && s.kv_heads > 0 &&
                          s.dim % s.q_heads == 0 && s.q_heads % s.kv_heads == 0 &&
                          s.head_dim() % 2 == 0 && s.window > 0;
    if (!shape_ok || w.byte_of.empty()) {
      throw std::runtime_error("not a tiny_lm model (no shape or vocabulary)");
    }
    const std::int64_t d = s.dim, e = s.head_dim();
    const std::int64_t vocab = static_cast<std::int64_t>(w.byte_of.size());
    std::map<std::string, std::vector<std::int64_t>> expected = {{"embed", {vocab, d}},
                                                                 {"norm_final", {d}}};
    for (std::int64_t l = 0; l < s.layers; ++l) {
      expected[layer_name(l, "norm1")] = {d};
      expected[layer_name(l, "wq")] = {d, s.q_heads * e};
      expected[layer_name(l, "wk")] = {d, s.kv_heads * e};
      expected[layer_name(l, "wv")] = {d, s.kv_heads * e};
      expected[layer_name(l, "wo")] = {s.q_heads * e, d};
      expected[layer_name(l, "norm2")] = {d};
      expected[layer_name(l, "w1")] = {d, 4 * d};
      expected[layer_name(l, "w2")] = {4 * d, d};
    }
    for (const auto& [name, sizes] : expected) {
      const auto it = w.params.find(name);
      if (it == w.params.end() || it->second.sizes().vec() != sizes ||
          it->second.scalar_type() != at::kFloat) {
        throw std::runtime_error("parameter " + name + " is missing or not float32 of its shape");
      }
    }
    return w;
  } catch (const std::exception& e) {
    *error = path + ": " + e.what();
    return std::nullopt;
  }
}

}  // namespace tiny_lm
