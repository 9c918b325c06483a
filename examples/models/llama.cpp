#include "llama.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <utility>

#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include "keel/v1/attention.h"
#include "tensor_file.h"

namespace models {

std::string default_model_dir() {
  const char* deps = std::getenv("KEEL_DEPS_DIR");
  const char* home = std::getenv("HOME");
  const std::string base =
      deps != nullptr ? deps : std::string(home != nullptr ? home : ".") + "/.cache/keel";
  return base + "/models/smollm2-135m-instruct";
}

namespace {

keel::Error bad(const std::string& path, const std::string& what) {
  return {keel::Errc::corrupt_data, path + ": " + what};
}

}  // namespace

keel::result<LlamaConfig> LlamaConfig::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return keel::Error(keel::Errc::io_error, "cannot open " + path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad(path, "not a JSON object");
  LlamaConfig c;
  auto integer = [&](const char* name, std::int64_t& out) -> bool {
    if (!j.contains(name) || !j[name].is_number_integer()) return false;
    out = j[name].get<std::int64_t>();
    return true;
  };
  auto real = [&](const char* name, double& out) -> bool {
    if (!j.contains(name) || !j[name].is_number()) return false;
    out = j[name].get<double>();
    return std::isfinite(out) && out > 0;
  };
  const char* missing = nullptr;
  if (!integer("hidden_size", c.hidden_size)) missing = "hidden_size";
  if (!integer("num_hidden_layers", c.layers)) missing = "num_hidden_layers";
  if (!integer("num_attention_heads", c.heads)) missing = "num_attention_heads";
  if (!integer("num_key_value_heads", c.kv_heads)) missing = "num_key_value_heads";
  if (!integer("head_dim", c.head_dim)) missing = "head_dim";
  if (!integer("intermediate_size", c.intermediate_size)) missing = "intermediate_size";
  if (!integer("max_position_embeddings", c.max_positions)) missing = "max_position_embeddings";
  if (!real("rope_theta", c.rope_theta)) missing = "rope_theta";
  if (!real("rms_norm_eps", c.rms_norm_eps)) missing = "rms_norm_eps";
  if (missing != nullptr) return bad(path, std::string(missing) + " is missing or not a number");
  integer("bos_token_id", c.bos_token_id);
  integer("eos_token_id", c.eos_token_id);
  c.tie_word_embeddings = j.value("tie_word_embeddings", true);
  if (j.value("architecture", "llama") != "llama") return bad(path, "architecture is not llama");
  if (c.hidden_size <= 0 || c.layers <= 0 || c.heads <= 0 || c.kv_heads <= 0 ||
      c.heads % c.kv_heads != 0 || c.head_dim <= 0 || c.head_dim % 2 != 0 ||
      c.intermediate_size <= 0 || c.max_positions <= 0) {
    return bad(path, "inconsistent sizes (heads must be a multiple of kv heads, head_dim even)");
  }
  return c;
}

keel::result<Llama> Llama::load(const std::string& dir, at::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    return keel::Error(keel::Errc::invalid_argument,
                       "Llama::load: dtype must be float32 or bfloat16");
  }
  auto config = LlamaConfig::load(dir + "/config.json");
  if (!config) return config.error();
  const std::string path = dir + "/model.safetensors";
  auto file = read_tensor_file(path);
  if (!file) return file.error();
  std::map<std::string, at::Tensor>& w = file.value();
  Llama m;
  m.config_ = config.value();
  LlamaConfig& c = m.config_;
  const std::int64_t d = c.hidden_size, e = c.head_dim;
  auto take = [&](const std::string& name,
                  const std::vector<std::int64_t>& shape) -> keel::result<at::Tensor> {
    const auto it = w.find(name);
    if (it == w.end()) return bad(path, "tensor " + name + " is missing");
    if (it->second.sizes().vec() != shape) {
      return bad(path, "tensor " + name + " is " + c10::str(it->second.sizes()) + ", not " +
                           c10::str(at::IntArrayRef(shape)));
    }
    if (it->second.scalar_type() != at::kFloat)
      return bad(path, "tensor " + name + " is not float32");
    at::Tensor t = it->second.to(dtype);
    w.erase(it);
    return t;
  };
  auto embed = w.find("model.embed_tokens.weight");
  if (embed == w.end() || embed->second.dim() != 2)
    return bad(path, "no 2-d model.embed_tokens.weight");
  c.vocab_size = embed->second.size(0);
#define KEEL_TAKE(var, name, ...)       \
  auto var = take(name, {__VA_ARGS__}); \
  if (!var) return var.error();
  KEEL_TAKE(emb, "model.embed_tokens.weight", c.vocab_size, d)
  KEEL_TAKE(norm, "model.norm.weight", d)
  m.embed_ = emb.value();
  m.norm_ = norm.value();
  if (c.tie_word_embeddings) {
    m.lm_head_ = m.embed_;
  } else {
    KEEL_TAKE(head, "lm_head.weight", c.vocab_size, d)
    m.lm_head_ = head.value();
  }
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    KEEL_TAKE(attn_norm, p + "input_layernorm.weight", d)
    KEEL_TAKE(q, p + "self_attn.q_proj.weight", c.heads * e, d)
    KEEL_TAKE(k, p + "self_attn.k_proj.weight", c.kv_heads * e, d)
    KEEL_TAKE(v, p + "self_attn.v_proj.weight", c.kv_heads * e, d)
    KEEL_TAKE(o, p + "self_attn.o_proj.weight", d, c.heads * e)
    KEEL_TAKE(ffn_norm, p + "post_attention_layernorm.weight", d)
    KEEL_TAKE(gate, p + "mlp.gate_proj.weight", c.intermediate_size, d)
    KEEL_TAKE(up, p + "mlp.up_proj.weight", c.intermediate_size, d)
    KEEL_TAKE(down, p + "mlp.down_proj.weight", d, c.intermediate_size)
    // q, k and v in one matrix, gate and up in another: one product each.
    // Stored input-major ([in, out], products as x @ W): for a single row
    // MKL streams that layout about 6% faster than [out, in] (measured over
    // 400 decode steps: 8.3 s against 8.8 s in the products).
    auto input_major = [](const at::Tensor& w) { return w.t().contiguous(); };
    m.layers_.push_back({attn_norm.value(), input_major(at::cat({q.value(), k.value(), v.value()})),
                         input_major(o.value()), ffn_norm.value(),
                         input_major(at::cat({gate.value(), up.value()})),
                         input_major(down.value())});
  }
#undef KEEL_TAKE
  if (!w.empty()) return bad(path, "tensor " + w.begin()->first + " is not part of a llama model");
  // Hugging Face's inverse frequencies, computed as it computes them (in
  // float32), so that the angles round alike.
  m.inv_freq_ =
      at::pow(c.rope_theta, at::arange(0, e, 2, at::kLong).to(at::kFloat) / e).reciprocal();
  return m;
}

KVCache Llama::make_cache(std::int64_t pages, std::int64_t page_size) const {
  KVCache cache;
  cache.page_size = page_size;
  for (std::int64_t l = 0; l < config_.layers; ++l) {
    cache.k.push_back(at::zeros({pages, config_.kv_heads, page_size, config_.head_dim}, dtype()));
    cache.v.push_back(at::zeros({pages, config_.kv_heads, page_size, config_.head_dim}, dtype()));
  }
  return cache;
}

// RMSNorm as Hugging Face's Llama computes it: in float32, then back.
at::Tensor Llama::rms_norm(const at::Tensor& x, const at::Tensor& weight) const {
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor normed = h * at::rsqrt(h.pow(2).mean(-1, true) + config_.rms_norm_eps);
  return weight * normed.to(x.scalar_type());
}

// cos and sin `[T, head_dim]` of positions `[T]` (int64), as rotate_half uses them.
std::pair<at::Tensor, at::Tensor> Llama::rope(const at::Tensor& positions) const {
  const at::Tensor freqs = at::outer(positions.to(at::kFloat), inv_freq_);
  const at::Tensor angle = at::cat({freqs, freqs}, -1);
  return {angle.cos().to(dtype()), angle.sin().to(dtype())};
}

namespace {
// x `[..., T, H, E]` rotated: x * cos + rotate_half(x) * sin.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}
}  // namespace

// One block over rows x `[T, D]`, every row rotated by its own angles cos
// and sin `[T, 1, E]`; `attend` maps q `[T, H, E]`, k and v `[T, Hkv, E]` to
// `[T, H, E]` (the paged call when serving, the dense one when training).
keel::result<at::Tensor> Llama::block(const Layer& layer, const at::Tensor& x,
                                      const at::Tensor& cos, const at::Tensor& sin,
                                      const Attend& attend) const {
  const LlamaConfig& c = config_;
  const std::int64_t t = x.size(0), e = c.head_dim, f = c.intermediate_size;
  const std::int64_t hq = c.heads * e, hkv = c.kv_heads * e;
  const at::Tensor qkv = at::mm(rms_norm(x, layer.attn_norm), layer.qkv);
  // q's and k's heads rotated together, in one pass.
  const at::Tensor qk =
      apply_rope(qkv.narrow(1, 0, hq + hkv).view({t, c.heads + c.kv_heads, e}), cos, sin);
  keel::result<at::Tensor> a = attend(qk.narrow(1, 0, c.heads), qk.narrow(1, c.heads, c.kv_heads),
                                      qkv.narrow(1, hq + hkv, hkv).view({t, c.kv_heads, e}));
  if (!a) return a.error();
  // The residual adds fused into the products (x + a o in one call).
  const at::Tensor h = at::addmm(x, a.value().reshape({t, hq}), layer.o);
  const at::Tensor gate_up = at::mm(rms_norm(h, layer.ffn_norm), layer.gate_up);
  return at::addmm(h, at::silu(gate_up.narrow(1, 0, f)) * gate_up.narrow(1, f, f), layer.down);
}

keel::result<at::Tensor> Llama::step(const std::vector<StepSequence>& sequences,
                                     KVCache& cache) const {
  const LlamaConfig& c = config_;
  const std::int64_t ps = cache.page_size;
  if (sequences.empty()) return keel::Error(keel::Errc::invalid_argument, "step: no sequences");
  if (static_cast<std::int64_t>(cache.k.size()) != c.layers || ps <= 0) {
    return keel::Error(keel::Errc::invalid_argument, "step: the cache is not this model's");
  }
  const auto b = static_cast<std::int64_t>(sequences.size());
  std::int64_t max_pages = 1;
  for (const StepSequence& s : sequences) {
    max_pages = std::max(max_pages, static_cast<std::int64_t>(s.pages.size()));
  }
  std::vector<std::int64_t> tokens, positions, slot_page, slot_off, cu{0}, lengths;
  std::vector<std::int64_t> table(static_cast<std::size_t>(b * max_pages), 0);
  for (std::int64_t i = 0; i < b; ++i) {
    const StepSequence& s = sequences[static_cast<std::size_t>(i)];
    const auto n = static_cast<std::int64_t>(s.tokens.size());
    const std::string which = "step: sequence " + std::to_string(i);
    if (s.first < 0 || s.first + n > c.max_positions) {
      return keel::Error(keel::Errc::invalid_argument,
                         which + " reaches position " + std::to_string(s.first + n) +
                             ", past the model's " + std::to_string(c.max_positions));
    }
    if (s.first + n > static_cast<std::int64_t>(s.pages.size()) * ps) {
      return keel::Error(keel::Errc::invalid_argument,
                         which + " needs " + std::to_string(s.first + n) + " keys but has " +
                             std::to_string(s.pages.size()) + " pages of " + std::to_string(ps));
    }
    for (const std::int64_t page : s.pages) {
      if (page < 0 || page >= cache.pages()) {
        return keel::Error(keel::Errc::invalid_argument,
                           which + " lists page " + std::to_string(page) + " outside the cache's " +
                               std::to_string(cache.pages()));
      }
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t token = s.tokens[static_cast<std::size_t>(j)], pos = s.first + j;
      if (token < 0 || token >= c.vocab_size) {
        return keel::Error(keel::Errc::invalid_argument,
                           which + " has token " + std::to_string(token) +
                               " outside the vocabulary of " + std::to_string(c.vocab_size));
      }
      tokens.push_back(token);
      positions.push_back(pos);
      slot_page.push_back(s.pages[static_cast<std::size_t>(pos / ps)]);
      slot_off.push_back(pos % ps);
    }
    std::copy(s.pages.begin(), s.pages.end(), table.begin() + i * max_pages);
    cu.push_back(cu.back() + n);
    lengths.push_back(s.first + n);
  }
  const at::Tensor page_table = at::tensor(table).view({b, max_pages});
  const at::Tensor cu_t = at::tensor(cu), lengths_t = at::tensor(lengths);
  const at::Tensor page_idx = at::tensor(slot_page), off_idx = at::tensor(slot_off);
  auto [cos, sin] = rope(at::tensor(positions));
  cos = cos.unsqueeze(1);  // [T, 1, E]: every head alike
  sin = sin.unsqueeze(1);

  keel::AttentionSpec spec;
  spec.masks = {keel::Mask::causal(keel::CausalAlignment::bottom_right)};
  c10::NoGradGuard no_grad;
  at::Tensor x = embed_.index_select(0, at::tensor(tokens));
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    auto attend = [&](const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v) -> keel::result<at::Tensor> {
      // The step's keys and values go into their pages first: each
      // sequence's queries then read its whole cache, its new keys included.
      using at::indexing::Slice;
      cache.k[l].index_put_({page_idx, Slice(), off_idx}, k);
      cache.v[l].index_put_({page_idx, Slice(), off_idx}, v);
      auto a =
          keel::attention(keel::PackedQueries{q, cu_t},
                          keel::PagedKVCache{cache.k[l], cache.v[l], page_table, lengths_t}, spec);
      if (!a) return a.error();
      return a.value().out;
    };
    auto next = block(layers_[l], x, cos, sin, attend);
    if (!next) return next.error();
    x = next.value();
  }
  return rms_norm(x, norm_);
}

keel::result<at::Tensor> Llama::forward(const at::Tensor& tokens) const {
  const LlamaConfig& c = config_;
  if (tokens.dim() != 2 || tokens.scalar_type() != at::kLong) {
    return keel::Error(keel::Errc::invalid_argument, "forward: tokens must be int64 [B, L]");
  }
  const std::int64_t b = tokens.size(0), len = tokens.size(1), e = c.head_dim;
  if (len > c.max_positions) {
    return keel::Error(keel::Errc::invalid_argument,
                       "forward: longer than max_position_embeddings");
  }
  if (tokens.numel() > 0 && (tokens.min().item<std::int64_t>() < 0 ||
                             tokens.max().item<std::int64_t>() >= c.vocab_size)) {
    return keel::Error(keel::Errc::invalid_argument, "forward: a token is outside the vocabulary");
  }
  // Rows [B * L, D]: sequence-major, each row at its position in its sequence.
  auto [cos, sin] = rope(at::arange(len, at::kLong).repeat({b}));
  cos = cos.unsqueeze(1);
  sin = sin.unsqueeze(1);
  keel::AttentionSpec spec;
  spec.masks = {keel::Mask::causal()};
  auto attend = [&](const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v) -> keel::result<at::Tensor> {
    // [B, H, L, E] for the dense call, and back to rows.
    auto heads = [&](const at::Tensor& r) {
      return r.view({b, len, r.size(1), e}).transpose(1, 2);
    };
    auto a = keel::attention(heads(q), heads(k), heads(v), spec);
    if (!a) return a.error();
    return a.value().out.transpose(1, 2).reshape({b * len, c.heads, e});
  };
  at::Tensor x = at::embedding(embed_, tokens.reshape({-1}));
  for (const Layer& layer : layers_) {
    auto next = block(layer, x, cos, sin, attend);
    if (!next) return next.error();
    x = next.value();
  }
  return rms_norm(x, norm_).view({b, len, c.hidden_size});
}

at::Tensor Llama::logits(const at::Tensor& hidden) const {
  return at::linear(hidden, lm_head_).to(at::kFloat);
}

std::vector<std::pair<std::string, at::Tensor>> Llama::parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out{{"embed", embed_}, {"norm", norm_}};
  if (!config_.tie_word_embeddings) out.emplace_back("lm_head", lm_head_);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const Layer& y = layers_[l];
    out.insert(out.end(), {{p + "attn_norm", y.attn_norm},
                           {p + "qkv", y.qkv},
                           {p + "o", y.o},
                           {p + "ffn_norm", y.ffn_norm},
                           {p + "gate_up", y.gate_up},
                           {p + "down", y.down}});
  }
  return out;
}

}  // namespace models
