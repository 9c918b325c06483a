#include "compat_adapter.h"

#include "attention.h"

#include "c10d_engine.h"
#include "comm.h"
#include "dispatch/logsumexp.h"
#include "linear_cross_entropy.h"
#include "masked_logsumexp.h"

namespace keel::adapters {
namespace {

class CompatLogsumexp final : public internal::LogsumexpKernel {
 public:
  internal::Support supports(const internal::LogsumexpCall& /*call*/) const override {
    return internal::Support::yes();
  }
  at::Tensor run(const internal::LogsumexpCall& call) const override {
    return compat::masked_logsumexp(call.input, call.mask, call.dim, call.keepdim);
  }
};

class CompatAdapter final : public internal::Adapter {
 public:
  Backend kind() const noexcept override { return Backend::compat; }

  AdapterInfo info() const override {
    AdapterInfo info;
    info.name = "compat";
    info.description =
        "keel's own implementations on ATen ops present since libtorch 2.9 (compat/)";
    CapabilityInfo lse;
    lse.operation = "logsumexp";
    lse.dtypes = {"float16", "bfloat16", "float32", "float64"};
    lse.devices = {"cpu", "cuda"};
    lse.features = {"mask", "keepdim", "zero gradient on empty rows"};
    lse.implementation = "compat::masked_logsumexp: max-shifted exp/sum/log in float32";
    info.capabilities.push_back(std::move(lse));
    info.capabilities.push_back(CompatLinearCrossEntropy::info());
    info.capabilities.push_back(attention_capability());
    info.capabilities.push_back(comm_capability(compat_comm_implementation()));
    return info;
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
  return std::make_unique<CompatAdapter>();
}

}  // namespace keel::adapters
