// The score modifiers that keel's own attention products add to their scores
// (dense, block-sparse and decode alike): ALiBi and bias. Softcap is a
// function of the score, applied where the scores are.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "keel/v1/attention.h"

namespace keel::kernels {

// ALiBi and bias for the scores of queries [q0, q0 + q_rows) against the keys
// `keys` (int64 positions), in the dtype of `scores`, added to it.
at::Tensor add_score_modifiers(const at::Tensor& scores, const AttentionSpec& spec, std::int64_t q0,
                               std::int64_t q_rows, const at::Tensor& keys, std::int64_t q_len,
                               std::int64_t kv_len);

}  // namespace keel::kernels
