// The softmax pieces keel's attention kernels and its logsumexp share on
// plain ATen ops: the one empty-row-safe log-sum-exp.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include <ATen/ATen.h>

#include "keel/v1/attention.h"

namespace keel::kernels {

// Softmax over `dim` (kept, of size 1, in denominator and lse) with a fully
// masked row (all -inf) giving 0 output weights and lse -inf, and a zero
// gradient there.
struct RowSoftmax {
  at::Tensor weights_unnormalised;  // exp(s - shift)
  at::Tensor denominator;           // sum, 1 where the row is empty
  at::Tensor lse;                   // [..., 1, ...]
};

inline RowSoftmax row_softmax(const at::Tensor& s, std::int64_t dim = -1) {
  // The shift by the row maximum keeps exp() from overflowing and carries
  // no gradient; a row with no finite maximum (all -inf, or +inf) is shifted
  // by 0, not by +-inf (which gives NaN). A reduction over an empty `dim`
  // is a row of no entries: shift 0, lse -inf (libtorch 2.9's max()
  // refuses an empty reduction; the layout suite found it).
  at::Tensor shift;
  if (s.size(dim) == 0) {
    std::vector<std::int64_t> sizes = s.sizes().vec();
    sizes[static_cast<std::size_t>(at::maybe_wrap_dim(dim, s.dim()))] = 1;
    shift = at::zeros(sizes, s.options());
  } else {
    shift = std::get<0>(s.detach().max(dim, /*keepdim=*/true));
  }
  shift = at::where(shift.isfinite(), shift, at::zeros_like(shift));
  const at::Tensor e = (s - shift).exp();
  const at::Tensor sum = e.sum(dim, /*keepdim=*/true);
  // An empty row (sum 0) would give log(0) = -inf with a 0 * inf = NaN
  // gradient: it is routed around log(), so that its gradient is 0.
  const at::Tensor empty = sum == 0;
  const at::Tensor safe = at::where(empty, at::ones_like(sum), sum);
  const at::Tensor lse =
      at::where(empty, at::full({}, -std::numeric_limits<double>::infinity(), sum.options()),
                safe.log() + shift);
  return {e, safe, lse};
}

// 0, as a function of every differentiable input (so that backward reaches
// each of them with a zero gradient when no key is visible at all).
inline at::Tensor zero_tied_to_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const AttentionSpec& spec) {
  at::Tensor sum = q.sum() + k.sum() + v.sum();
  if (spec.bias.defined()) sum = sum + spec.bias.sum().to(sum.scalar_type());
  return sum * 0;
}

}  // namespace keel::kernels
