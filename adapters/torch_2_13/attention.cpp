#include "attention.h"

#include <string>

#include "torch_2_9/attention.h"

namespace keel::adapters {

namespace {

// libtorch 2.13 adds no C++ attention entry over 2.9: FlexAttention is still
// a Python higher-order op, and no varlen ATen op is exposed
// (include/ATen/ops has none). SDPA is in both releases, so native serves
// every call through the compat route and says so.
class NativeAttention final : public internal::AttentionKernel {
 public:
  internal::Support supports(const internal::AttentionCall& /*call*/) const override {
    return internal::Support::yes();
  }
  internal::AttentionResult run(const internal::AttentionCall& call) const override {
    internal::AttentionResult r = compat_attention_route(call);
    r.path =
        "libtorch 2.13 adds no C++ attention path over 2.9 (no FlexAttention or varlen ATen "
        "op), so native " +
        r.path;
    return r;
  }
};

}  // namespace

const internal::AttentionKernel& native_attention_kernel() {
  static const NativeAttention kernel;
  return kernel;
}

}  // namespace keel::adapters
