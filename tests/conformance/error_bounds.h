// How the conformance suites measure an error: the largest absolute
// difference over the reference's finite entries (infinities are compared
// exactly by the suites that produce them), on the host, in float64.
#pragma once

#include <ATen/ATen.h>

namespace keel::testing {

inline double max_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().cpu().to(at::kDouble);
  const at::Tensor w = want.detach().cpu().to(at::kDouble);
  const at::Tensor finite = w.isfinite();
  if (!finite.any().item<bool>()) return 0.0;
  return (g - w).abs().masked_select(finite).max().item<double>();
}

}  // namespace keel::testing
