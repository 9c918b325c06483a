#include "compat/compat_adapter.h"

#include "compat/attention.h"
#include "compat/comm.h"
#include "compat/linear_cross_entropy.h"
#include "dispatch/logsumexp.h"
#include "masked_logsumexp.h"
#include "vector_math.h"

namespace keel::adapters {
namespace {

class CompatLogsumexp final : public internal::LogsumexpKernel {
 public:
  const internal::Capability& capability() const noexcept override {
    static const internal::Capability kCapability = internal::Capability::floating(
        "logsumexp", {internal::kFeatureMask, "keepdim", "zero gradient on empty rows"},
        "kernels::masked_logsumexp: max-shifted exp/sum/log in float32");
    return kCapability;
  }
  at::Tensor run(const internal::LogsumexpCall& call) const override {
    return kernels::masked_logsumexp(call.input, call.mask, call.dim, call.keepdim);
  }
};

class CompatAdapter final : public internal::Adapter {
 public:
  Backend kind() const noexcept override { return Backend::compat; }

  std::string description() const override {
    return "keel's own implementations on ATen ops present since libtorch 2.9 (kernels/)";
  }

  const internal::LogsumexpKernel* logsumexp() const noexcept override { return &logsumexp_; }
  const internal::LinearCrossEntropyKernel* linear_cross_entropy() const noexcept override {
    return &linear_cross_entropy_;
  }

  const internal::AttentionKernel* attention() const noexcept override {
    return &compat_attention_kernel();
  }

  const internal::CommKernel* comm() const noexcept override { return &compat_comm_kernel(); }

 private:
  CompatLogsumexp logsumexp_;
  CompatLinearCrossEntropy linear_cross_entropy_;
};

}  // namespace

std::unique_ptr<internal::Adapter> make_compat_adapter() {
  kernels::settle_vector_math();  // before this adapter serves anything
  return std::make_unique<CompatAdapter>();
}

}  // namespace keel::adapters
