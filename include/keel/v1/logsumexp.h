/// @file keel/v1/logsumexp.h
/// @brief `keel::logsumexp`: a masked, overflow-safe log-sum-exp.
///
/// log(sum(exp(x))) along one dimension, over the entries a boolean mask
/// keeps, accumulated in float32 (or float64 for float64 input). It is the
/// reduction at the heart of keel's attention and fused cross-entropy, and
/// the smallest operation served by every adapter, so it is also the place
/// to see dispatch at work.
///
/// In one line:
/// `auto r = keel::logsumexp(x, options);` then `r.value().value`.
///
/// In full:
///
/// @snippet examples/snippets/header_snippets.cpp logsumexp_masked
///
/// Semantics every adapter keeps:
/// - A row whose entries are all masked out, or all -inf, gives -inf (never
///   NaN), and its gradient is 0.
/// - A row holding +inf gives +inf; a row holding NaN gives NaN.
/// - The result is differentiable through autograd with respect to `input`.
///
/// Traps:
/// - Every call's `keel::result` is `[[nodiscard]]`: ignoring one is a
///   warning (an error under `-Werror`); drop one on purpose with `(void)`.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "keel/v1/dispatch.h"
#include "keel/v1/error.h"
#include "keel/v1/export.h"

namespace keel {
inline namespace v1 {

/// Options of `keel::logsumexp`.
struct LogsumexpOptions {
  /// The dimension reduced; negative counts from the end.
  std::int64_t dim = -1;
  /// Keep the reduced dimension with size 1.
  bool keepdim = false;
  /// Optional boolean mask, broadcastable to the input's shape: `true` keeps
  /// an entry, `false` leaves it out. Undefined (the default) keeps all.
  at::Tensor mask;
  /// Which adapter serves the call.
  DispatchOptions dispatch;
};

/// The result of `keel::logsumexp`.
struct LogsumexpOutput {
  /// The log-sum-exp: the input's shape without `dim` (or with size 1 there,
  /// with `keepdim`); float32 for float16/bfloat16/float32 input, float64
  /// for float64 input.
  at::Tensor value;
  /// Which adapter served the call, and why.
  DispatchInfo dispatch;
};

/// Computes the log-sum-exp of `input` along `options.dim`.
///
/// `input` must be a defined floating-point tensor (float16, bfloat16,
/// float32, float64) with at least one dimension; `options.mask`, when
/// defined, a bool tensor on the same device broadcastable to it. Both may
/// have any layout a view can have (strided, transposed, offset, expanded),
/// read as plain ATen ops read it. Errors:
/// `invalid_argument` for bad arguments, `unsupported` when the requested
/// adapter cannot serve the call, `backend_error` when libtorch fails.
KEEL_API result<LogsumexpOutput> logsumexp(const at::Tensor& input,
                                           const LogsumexpOptions& options = {});

}  // namespace v1
}  // namespace keel
