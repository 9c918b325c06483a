#include "loss_plan.h"

#include <algorithm>
#include <limits>

#include "accumulation.h"

namespace keel::kernels {

bool needs_scratch(const LinearCrossEntropyConfig& config, bool class_weights, bool grad) {
  return (config.label_smoothing > 0 && class_weights) || (config.logit_softcap > 0 && grad);
}

at::ScalarType accumulation_dtype(at::ScalarType input, const LinearCrossEntropyConfig& config) {
  if (config.accumulation != at::ScalarType::Undefined) return config.accumulation;
  return accumulation_dtype(input);
}

namespace {

// Below this many whole rows per chunk, the rank-`rows` update of
// grad_weight made by every chunk becomes bound by memory bandwidth (it
// reads and writes all of grad_weight for 2 * rows flops per element), so
// the automatic plan switches to vocabulary blocks of kRowsPerVocabBlock
// tokens instead.
constexpr std::int64_t kMinRowsPerChunk = 32;
constexpr std::int64_t kRowsPerVocabBlock = 512;
// At most this many rows per automatic chunk, even when a small vocabulary
// would allow more: larger chunks gain nothing once the GEMMs are large.
constexpr std::int64_t kMaxRowsPerChunk = 1024;

std::int64_t element_size(at::ScalarType t) {
  return static_cast<std::int64_t>(c10::elementSize(t));
}

// Bytes of working set per element of a [tokens, vocab] block: the block
// itself in the accumulation dtype, a second one when the loss needs the
// logits next to their exponentials (weighted smoothing; soft-capping with
// a gradient), and one in the input dtype when that differs (the GEMM's
// output before the upcast, then the logit gradient for the dX GEMM).
std::int64_t bytes_per_element(at::ScalarType input, at::ScalarType acc,
                               const LinearCrossEntropyConfig& config, bool class_weights,
                               bool grad) {
  std::int64_t bytes = element_size(acc);
  if (needs_scratch(config, class_weights, grad)) bytes += element_size(acc);
  if (input != acc) bytes += element_size(input);
  return bytes;
}

// The working-set budget of a call: config.budget_bytes, or the automatic one.
std::int64_t budget_bytes(std::int64_t n_tokens, std::int64_t features, std::int64_t vocab,
                          at::ScalarType input, const LinearCrossEntropyConfig& config) {
  if (config.budget_bytes > 0) return config.budget_bytes;
  // (N + V) * D * element size / 8, in double: the product may pass 2^63
  // for sizes no allocation could hold.
  const double gradients = (static_cast<double>(n_tokens) + static_cast<double>(vocab)) *
                           static_cast<double>(features) *
                           static_cast<double>(element_size(accumulation_dtype(input, config)));
  const double share = gradients / static_cast<double>(kGradientBytesPerBudgetByte);
  constexpr double kMax = static_cast<double>(std::numeric_limits<std::int64_t>::max()) / 2;
  return std::max(kMinAutomaticBudgetBytes, static_cast<std::int64_t>(std::min(share, kMax)));
}

}  // namespace

ChunkPlan plan_chunks(std::int64_t n_tokens, std::int64_t features, std::int64_t vocab,
                      at::ScalarType input, const LinearCrossEntropyConfig& config,
                      bool class_weights, bool grad) {
  const at::ScalarType acc = accumulation_dtype(input, config);
  const std::int64_t bytes = bytes_per_element(input, acc, config, class_weights, grad);
  const std::int64_t budget = budget_bytes(n_tokens, features, vocab, input, config);
  const std::int64_t tokens_max = std::max<std::int64_t>(1, n_tokens);
  ChunkPlan plan;
  plan.vocab = config.vocab_chunk_size > 0 ? std::min(config.vocab_chunk_size, vocab) : vocab;
  if (config.chunk_size > 0) {
    plan.tokens = std::min(config.chunk_size, tokens_max);
    return plan;
  }
  if (config.vocab_chunk_size > 0) {
    plan.tokens = std::clamp<std::int64_t>(budget / (plan.vocab * bytes), 1,
                                           std::min(tokens_max, kMaxRowsPerChunk));
    return plan;
  }
  const std::int64_t rows = budget / (vocab * bytes);
  if (!grad && rows < std::min(tokens_max, kMaxRowsPerChunk)) {
    // Without a gradient the forward is one GEMM and an online
    // log-sum-exp: vocabulary blocks of kMaxRowsPerChunk tokens repack W
    // N / 1024 times where whole rows of the budget would repack it N / rows
    // times (at the CI size 1024 x 4608 blocks take 0.75-0.95 of the naive
    // forward's time, 144 whole rows 1.06-1.4).
    plan.tokens = std::min(tokens_max, kMaxRowsPerChunk);
    plan.vocab = std::clamp<std::int64_t>(budget / (plan.tokens * bytes), 1, vocab);
    return plan;
  }
  if (rows >= std::min(kMinRowsPerChunk, tokens_max)) {
    plan.tokens = std::min({rows, tokens_max, kMaxRowsPerChunk});
    return plan;
  }
  plan.tokens = std::min(kRowsPerVocabBlock, tokens_max);
  plan.vocab = std::clamp<std::int64_t>(budget / (plan.tokens * bytes), 1, vocab);
  return plan;
}

}  // namespace keel::kernels
