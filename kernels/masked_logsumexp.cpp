#include "masked_logsumexp.h"

#include <limits>

#include <ATen/ATen.h>

#include "accumulation.h"

namespace keel::kernels {

at::Tensor masked_logsumexp(const at::Tensor& input, const at::Tensor& mask, std::int64_t dim,
                            bool keepdim) {
  constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
  at::Tensor x = input.to(accumulation_dtype(input.scalar_type()));
  if (mask.defined()) x = x.masked_fill(mask.logical_not(), kMinusInf);
  // The shift by the row maximum keeps exp() from overflowing; it does not
  // change the value, so it carries no gradient. A row with no finite
  // maximum (all -inf, or +inf) is shifted by 0 instead of by +-inf, which
  // would give NaN.
  at::Tensor shift = std::get<0>(x.detach().max(dim, /*keepdim=*/true));
  shift = at::where(shift.isfinite(), shift, at::zeros_like(shift));
  at::Tensor sum = (x - shift).exp().sum(dim, /*keepdim=*/true);
  // An empty row (sum 0) would give log(0) = -inf with a 0 * inf = NaN
  // gradient; route it around log() so that its gradient is 0.
  const at::Tensor empty = sum == 0;
  at::Tensor lse = at::where(empty, at::full({}, kMinusInf, sum.options()),
                             at::where(empty, at::ones_like(sum), sum).log().add(shift));
  return keepdim ? lse : lse.squeeze(dim);
}

}  // namespace keel::kernels
