#include "masked_logsumexp.h"

#include <limits>

#include <ATen/ATen.h>

#include "accumulation.h"
#include "row_softmax.h"

namespace keel::kernels {

at::Tensor masked_logsumexp(const at::Tensor& input, const at::Tensor& mask, std::int64_t dim,
                            bool keepdim) {
  constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
  at::Tensor x = input.to(accumulation_dtype(input.scalar_type()));
  if (mask.defined()) x = x.masked_fill(mask.logical_not(), kMinusInf);
  const at::Tensor lse = row_softmax(x, dim).lse;
  return keepdim ? lse : lse.squeeze(dim);
}

}  // namespace keel::kernels
