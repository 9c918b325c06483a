// A Llama-family decoder on keel::v1 (SmolLM2, Llama 2/3 and their kin):
// token embedding, RMSNorm, rotary positions, grouped-query attention,
// SwiGLU and a tied or separate output projection. Configured from the
// model's `config.json`; its weights are float32 safetensors under Hugging
// Face's names (scripts/convert-gguf.py writes both from a GGUF file).
//
// Serving: the KV cache lives in pages, and one `step` runs any mix of
// prefill chunks and decodes through keel's packed attention over the paged
// cache. Training: `forward` runs whole sequences through keel's dense
// attention and is differentiable.
//
//   auto model = models::Llama::load(dir, at::kFloat);
//   if (!model) return model.error();
//   const models::Llama& m = model.value();
//   models::KVCache cache = m.make_cache(/*pages=*/64, /*page_size=*/16);
//   models::StepSequence s{prompt_ids, /*first=*/0, /*pages=*/{0, 1, 2}};
//   at::Tensor hidden = m.step({s}, cache).value();       // [T, D]
//   at::Tensor next = m.logits(hidden.narrow(0, hidden.size(0) - 1, 1));
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "keel/v1/error.h"

namespace models {

/// Where scripts/fetch-deps.sh converts SmolLM2-135M-Instruct:
/// `$KEEL_DEPS_DIR/models/smollm2-135m-instruct` (`~/.cache/keel` when
/// KEEL_DEPS_DIR is unset): the default model of keel-generate and keel-serve.
std::string default_model_dir();

/// The architecture, read from `config.json` (Hugging Face's names).
struct LlamaConfig {
  std::int64_t hidden_size = 0;
  std::int64_t layers = 0;
  std::int64_t heads = 0;     ///< query heads
  std::int64_t kv_heads = 0;  ///< key/value heads (grouped-query when fewer)
  std::int64_t head_dim = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t vocab_size = 0;  ///< rows of the embedding
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  std::int64_t max_positions = 0;
  std::int64_t bos_token_id = -1, eos_token_id = -1;
  bool tie_word_embeddings = true;

  /// Reads and checks a `config.json`; an error names the file and field.
  static keel::result<LlamaConfig> load(const std::string& path);
};

/// The paged KV cache of every layer: layer l's keys are
/// `k[l]` `[pages, kv_heads, page_size, head_dim]`, its values likewise.
struct KVCache {
  std::vector<at::Tensor> k, v;
  std::int64_t page_size = 0;
  [[nodiscard]] std::int64_t pages() const { return k.empty() ? 0 : k.front().size(0); }
};

/// One sequence's part of a step: `tokens` at positions `first` ..
/// `first + tokens.size() - 1`, the keys of positions before `first` being
/// in the cache already. `pages` lists the sequence's pages in order,
/// enough for `first + tokens.size()` keys.
struct StepSequence {
  std::vector<std::int64_t> tokens;
  std::int64_t first = 0;
  std::vector<std::int64_t> pages;
};

/// A loaded model. Immutable: steps on different caches may run at once.
class Llama {
 public:
  /// Reads `dir/config.json` and `dir/model.safetensors`; `dtype` is
  /// float32 or bfloat16 (the float32 weights rounded to nearest even).
  /// A missing, truncated or inconsistent file is an error naming it.
  static keel::result<Llama> load(const std::string& dir, at::ScalarType dtype = at::kFloat);

  [[nodiscard]] const LlamaConfig& config() const { return config_; }
  [[nodiscard]] at::ScalarType dtype() const { return embed_.scalar_type(); }

  /// A zeroed cache of `pages` pages of `page_size` keys per layer.
  [[nodiscard]] KVCache make_cache(std::int64_t pages, std::int64_t page_size) const;

  /// One serving step over any mix of sequences: writes their new keys and
  /// values into their pages, then attends causally through
  /// `keel::attention(PackedQueries, PagedKVCache)`. Returns the final
  /// normed hidden states `[T, hidden_size]`, rows in the order of the
  /// sequences' tokens. `invalid_argument` for a token outside the
  /// vocabulary, a position past `max_positions`, too few pages or a page
  /// outside the cache; nothing is written then.
  [[nodiscard]] keel::result<at::Tensor> step(const std::vector<StepSequence>& sequences,
                                              KVCache& cache) const;

  /// Whole sequences `tokens` `[B, L]` (int64) from position 0, causal,
  /// through `keel::attention(q, k, v)`: the final normed hidden states
  /// `[B, L, hidden_size]`. Differentiable with respect to the parameters.
  [[nodiscard]] keel::result<at::Tensor> forward(const at::Tensor& tokens) const;

  /// The output projection of hidden states `[N, hidden_size]`: logits
  /// `[N, vocab_size]` in float32.
  [[nodiscard]] at::Tensor logits(const at::Tensor& hidden) const;

  /// Every parameter by keel's name (`layers.3.qkv`: q, k and v side by
  /// side, input-major `[in, out]`; `gate_up` likewise), for training and
  /// checks.
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>> parameters() const;

 private:
  // The matrices are input-major: qkv [D, (H + 2 Hkv) E], o [H E, D],
  // gate_up [D, 2 F], down [F, D].
  struct Layer {
    at::Tensor attn_norm, qkv, o, ffn_norm, gate_up, down;
  };
  using Attend = std::function<keel::result<at::Tensor>(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& v)>;
  [[nodiscard]] keel::result<at::Tensor> block(const Layer& layer, const at::Tensor& x,
                                               const at::Tensor& cos, const at::Tensor& sin,
                                               const Attend& attend) const;
  [[nodiscard]] at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight) const;
  [[nodiscard]] std::pair<at::Tensor, at::Tensor> rope(const at::Tensor& positions) const;

  LlamaConfig config_;
  at::Tensor embed_, norm_, lm_head_;
  at::Tensor inv_freq_;  // [head_dim / 2], float32
  std::vector<Layer> layers_;
};

}  // namespace models
