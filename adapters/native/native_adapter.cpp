#include "native_adapter.h"

#include <limits>

#include <ATen/ATen.h>
#include <torch/headeronly/version.h>

#include "attention.h"
#include "c10d_engine.h"
#include "comm.h"
#include "dispatch/linear_cross_entropy.h"
#include "dispatch/logsumexp.h"
#include "masked_logsumexp.h"

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
  internal::Support supports(const internal::LogsumexpCall& call) const override {
    if (call.mask.defined()) {
      return internal::Support::no("the native adapter serves no mask (at::logsumexp takes none)");
    }
    return internal::Support::yes();
  }
  at::Tensor run(const internal::LogsumexpCall& call) const override {
    const at::Tensor x = call.input.to(compat::accumulation_dtype(call.input));
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
  internal::Support supports(const internal::LinearCrossEntropyCall& /*call*/) const override {
    return internal::Support::no(kNoNativeLinearCrossEntropy);
  }
  internal::LinearCrossEntropyResult run(
      const internal::LinearCrossEntropyCall& /*call*/) const override {
    TORCH_CHECK(false, kNoNativeLinearCrossEntropy);
  }
};

class NativeAdapter final : public internal::Adapter {
 public:
  Backend kind() const noexcept override { return Backend::native; }

  AdapterInfo info() const override {
    AdapterInfo info;
    info.name = "native";
    info.description = "paths libtorch " + std::to_string(TORCH_VERSION_MAJOR) + "." +
                       std::to_string(TORCH_VERSION_MINOR) +
                       " offers in C++ (docs/torch-api-matrix.md): logsumexp and comm here; "
                       "attention and linear_cross_entropy decline, so auto runs compat";
    CapabilityInfo lse;
    lse.operation = "logsumexp";
    lse.dtypes = {"float16", "bfloat16", "float32", "float64"};
    lse.devices = {"cpu", "cuda"};
    lse.features = {"keepdim", "zero gradient on empty rows"};
    lse.implementation = "at::logsumexp in float32";
    info.capabilities.push_back(std::move(lse));
    // Listed with nothing served, so that keel-info shows why.
    CapabilityInfo lce;
    lce.operation = "linear_cross_entropy";
    lce.implementation = std::string("none: ") + kNoNativeLinearCrossEntropy;
    info.capabilities.push_back(std::move(lce));
    CapabilityInfo attention;
    attention.operation = "attention";
    attention.implementation = std::string("none: ") + native_attention_refusal();
    info.capabilities.push_back(std::move(attention));
    info.capabilities.push_back(comm_capability(native_comm_implementation()));
    return info;
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
  return std::make_unique<NativeAdapter>();
}

}  // namespace keel::adapters
