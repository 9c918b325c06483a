// The attention capability: what the core hands an adapter after validation.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "dispatch/adapter.h"
#include "keel/v1/attention.h"

namespace keel::internal {

// A validated call: shapes agree, mask terms and modifiers are well formed,
// and `scale` is resolved (1/sqrt(E) when the spec left it unset). A paged
// call names its cache in `paged` (every page id and length checked), and
// `k`, `v` are its pools.
struct AttentionCall {
  const at::Tensor& q;
  const at::Tensor& k;
  const at::Tensor& v;
  const AttentionSpec& spec;
  double scale;
  const PagedKVCache* paged = nullptr;
};

// What a kernel computed, and which path inside the adapter computed it:
// `path` in words for DispatchInfo::reason, `route` as values.
struct AttentionResult {
  at::Tensor out;
  at::Tensor lse;  // defined when spec.return_lse
  std::string path;
  AttentionDispatch route;
};

class AttentionKernel {
 public:
  virtual ~AttentionKernel() = default;
  // What it serves; supports() and keel-info read this one value.
  virtual const Capability& capability() const noexcept = 0;
  Support supports(const AttentionCall& call) const {
    return capability().admits(call.q.scalar_type(), call.q.device().type());
  }
  // May throw (c10::Error, std::exception): the core turns it into an Error.
  virtual AttentionResult run(const AttentionCall& call) const = 0;
};

}  // namespace keel::internal
