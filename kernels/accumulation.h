// The one accumulation rule of keel's kernels: sums, maxima, log-sum-exps
// and the products a kernel accumulates itself run in float64 for float64
// inputs and in float32 for every other floating dtype (float16, bfloat16,
// float32). Inputs are read in their own dtype; only what accumulates widens.
#pragma once

#include <c10/core/ScalarType.h>

namespace keel::kernels {

inline constexpr at::ScalarType accumulation_dtype(at::ScalarType input) noexcept {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace keel::kernels
