// The float64 reference for logsumexp, on plain ATen ops and written
// independently of kernels/: every kept entry is exponentiated after a shift
// by the row maximum, summed, and logged. Rows with nothing kept are -inf.
#pragma once

#include <cstdint>
#include <limits>

#include <ATen/ATen.h>

namespace keel::reference {

// `mask` undefined keeps every entry.
inline at::Tensor logsumexp(const at::Tensor& input, const at::Tensor& mask, std::int64_t dim,
                            bool keepdim) {
  const double inf = std::numeric_limits<double>::infinity();
  at::Tensor x = input.detach().to(at::kDouble);
  at::Tensor keep =
      mask.defined() ? mask.expand_as(x) : at::ones_like(x, x.options().dtype(at::kBool));
  at::Tensor kept = at::where(keep, x, at::full({}, -inf, x.options()));
  at::Tensor m = kept.amax(dim, /*keepdim=*/true);
  at::Tensor safe_m = at::where(m.isfinite(), m, at::zeros_like(m));
  at::Tensor s = at::where(keep, (x - safe_m).exp(), at::zeros_like(x)).sum(dim, true);
  at::Tensor out = s.log() + safe_m;  // log(0) = -inf for empty rows
  return keepdim ? out : out.squeeze(dim);
}

// d logsumexp / d input: the softmax over the kept entries, 0 elsewhere and
// on empty rows.
inline at::Tensor logsumexp_gradient(const at::Tensor& input, const at::Tensor& mask,
                                     std::int64_t dim) {
  at::Tensor x = input.detach().to(at::kDouble);
  at::Tensor lse = logsumexp(input, mask, dim, /*keepdim=*/true);
  at::Tensor keep =
      mask.defined() ? mask.expand_as(x) : at::ones_like(x, x.options().dtype(at::kBool));
  at::Tensor p = (x - lse).exp();
  return at::where(keep & lse.isfinite(), p, at::zeros_like(p));
}

}  // namespace keel::reference
