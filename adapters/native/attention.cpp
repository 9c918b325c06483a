#include "native/attention.h"

#include <c10/util/Exception.h>

namespace keel::adapters {

namespace {

// No supported release offers a C++ attention path that keel's compat route
// does not already use: FlexAttention is a Python higher-order op, varlen
// attention a Python custom op, and ATen has no op for either
// (docs/torch-api-matrix.md §1.3, every release to 2.15). Serving attention
// here by running compat would be a silent fallback under Backend::native,
// so native declines every call with the reason; `auto` records the reason
// and runs compat, and an explicit native request is `unsupported`.
constexpr const char* kNoNativeAttention =
    "libtorch has no C++ attention path beyond what compat uses (FlexAttention and varlen "
    "attention are Python only; no ATen op), so keel's compat route serves attention";

class NativeAttention final : public internal::AttentionKernel {
 public:
  const internal::Capability& capability() const noexcept override {
    static const internal::Capability kCapability =
        internal::Capability::none("attention", kNoNativeAttention);
    return kCapability;
  }
  internal::AttentionResult run(const internal::AttentionCall& /*call*/) const override {
    TORCH_CHECK(false, kNoNativeAttention);
  }
};

}  // namespace

const internal::AttentionKernel& native_attention_kernel() {
  static const NativeAttention kernel;
  return kernel;
}

}  // namespace keel::adapters
