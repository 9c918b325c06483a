#include "native/native_adapter.h"

#include <limits>

#include <ATen/ATen.h>
#include <torch/headeronly/version.h>

#include "accumulation.h"
#include "dispatch/linear_cross_entropy.h"
#include "dispatch/logsumexp.h"
#include "native/attention.h"
#include "native/comm.h"
#include "vector_math.h"

// torch/headeronly/version.h is new in 2.13 (the macros moved there); CMake
// compiles this adapter only for >= 2.13, and this says so where it matters.
#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13)
#error "adapters/native needs libtorch 2.13 or later"
#endif

namespace keel::adapters {
namespace {

// logsumexp has been a fused ATen reduction for long; it stands in the native
// adapter as the smallest real operation that proves dispatch end to end, and
// it serves only what at::logsumexp computes itself: no mask.
class NativeLogsumexp final : public internal::LogsumexpKernel {
 public:
  // No mask: at::logsumexp takes none.
  const internal::Capability& capability() const noexcept override {
    static const internal::Capability kCapability = internal::Capability::floating(
        "logsumexp", {"keepdim", "zero gradient on empty rows"}, "at::logsumexp in float32");
    return kCapability;
  }
  at::Tensor run(const internal::LogsumexpCall& call) const override {
    const at::Tensor x = call.input.to(kernels::accumulation_dtype(call.input.scalar_type()));
    // at::logsumexp's backward is grad * exp(x - lse): NaN on an all -inf
    // row. keel promises 0 there, so such rows are fed zeros and set to -inf
    // after, which routes their gradient around the op.
    const at::Tensor empty = (x == -std::numeric_limits<double>::infinity()).all(call.dim, true);
    const at::Tensor lse = at::logsumexp(at::where(empty, at::zeros_like(x), x), call.dim, true);
    const at::Tensor out = at::where(
        empty, at::full({}, -std::numeric_limits<double>::infinity(), lse.options()), lse);
    return call.keepdim ? out : out.squeeze(call.dim);
  }
};

// libtorch 2.13 added linear_cross_entropy to torch.nn.functional in Python
// only (torch/nn/functional.py); there is no ATen op or C++ entry point to
// call. Serving it here by running compat would be a silent fallback under
// Backend::native, so native declines every call with the reason, and auto
// records that reason when it goes to compat.
constexpr const char* kNoNativeLinearCrossEntropy =
    "libtorch 2.13 has linear_cross_entropy only in Python (torch/nn/functional.py); no ATen "
    "op, so keel's chunked compat implementation serves it";

class NativeLinearCrossEntropy final : public internal::LinearCrossEntropyKernel {
 public:
  const internal::Capability& capability() const noexcept override {
    static const internal::Capability kCapability =
        internal::Capability::none("linear_cross_entropy", kNoNativeLinearCrossEntropy);
    return kCapability;
  }
  internal::LinearCrossEntropyResult run(
      const internal::LinearCrossEntropyCall& /*call*/) const override {
    TORCH_CHECK(false, kNoNativeLinearCrossEntropy);
  }
};

class NativeAdapter final : public internal::Adapter {
 public:
  Backend kind() const noexcept override { return Backend::native; }

  std::string description() const override {
    return "paths libtorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
           std::to_string(TORCH_VERSION_MINOR) +
           " offers in C++ (docs/torch-api-matrix.md): logsumexp and comm here; attention and "
           "linear_cross_entropy decline, so auto runs compat";
  }

  const internal::LogsumexpKernel* logsumexp() const noexcept override { return &logsumexp_; }
  const internal::LinearCrossEntropyKernel* linear_cross_entropy() const noexcept override {
    return &linear_cross_entropy_;
  }

  const internal::AttentionKernel* attention() const noexcept override {
    return &native_attention_kernel();
  }

  const internal::CommKernel* comm() const noexcept override { return &native_comm_kernel(); }

 private:
  NativeLogsumexp logsumexp_;
  NativeLinearCrossEntropy linear_cross_entropy_;
};

}  // namespace

std::unique_ptr<internal::Adapter> make_native_adapter() {
  kernels::settle_vector_math();  // before this adapter serves anything
  return std::make_unique<NativeAdapter>();
}

}  // namespace keel::adapters
