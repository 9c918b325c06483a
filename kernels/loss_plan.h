// The planner of keel's fused linear cross-entropy, as flash_plan.h is
// attention's: how a call is cut into token chunks and vocabulary blocks
// for its working-set budget. Pure arithmetic on sizes, unit-tested on exact
// plans (tests/unit/planners_test.cpp).
#pragma once

#include <cstdint>

#include <c10/core/ScalarType.h>

#include "loss_config.h"

namespace keel::kernels {

// The working-set budget the automatic chunk sizes are chosen for, when the
// caller gives none (budget_bytes = 0): an eighth of the gradients of hidden
// and weight in the accumulation dtype ((N + V) * D elements), which a
// training step holds anyway, and at least kMinAutomaticBudgetBytes. Small
// row chunks cost time (each repacks all of W for its GEMMs and rewrites all
// of grad_weight), a large block costs memory (the measured trade-off is in
// docs/benchmarks.md).
constexpr std::int64_t kMinAutomaticBudgetBytes = std::int64_t{8} << 20;
constexpr std::int64_t kGradientBytesPerBudgetByte = 8;

// How a call is cut: `tokens` rows per chunk, `vocab` classes per block
// (vocab == V: whole rows, no vocabulary blocks).
struct ChunkPlan {
  std::int64_t tokens = 1;
  std::int64_t vocab = 1;
};

// The chunking of a call with `n_tokens` tokens of `features` dimensions and
// `vocab` classes. An explicit chunk_size / vocab_chunk_size is kept
// (clamped to N / V); with both automatic, whole rows are used when at least
// kMinRowsPerChunk of them fit the budget, else vocabulary blocks of
// kRowsPerVocabBlock tokens; without a gradient (`grad` false), vocabulary
// blocks of 1024 tokens whenever fewer whole rows fit.
ChunkPlan plan_chunks(std::int64_t n_tokens, std::int64_t features, std::int64_t vocab,
                      at::ScalarType input, const LinearCrossEntropyConfig& config,
                      bool class_weights, bool grad);

// The accumulation dtype a config resolves to for an input dtype.
at::ScalarType accumulation_dtype(at::ScalarType input, const LinearCrossEntropyConfig& config);

// Whether a block needs a second one beside it in the accumulation dtype:
// the logits next to their exponentials (weighted label smoothing;
// soft-capping with a gradient).
bool needs_scratch(const LinearCrossEntropyConfig& config, bool class_weights, bool grad);

}  // namespace keel::kernels
