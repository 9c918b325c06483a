#include "torch_2_13/comm.h"

#include <utility>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "comm/backends.h"
#include "torch_2_9/comm.h"

namespace keel::adapters {
namespace {

class ProcessGroupEngine final : public BackendEngine {
 public:
  ProcessGroupEngine(c10::intrusive_ptr<c10d::Backend> backend,
                     c10::intrusive_ptr<c10d::Store> store, int rank, int size)
      : BackendEngine(backend),
        group_(c10::make_intrusive<c10d::ProcessGroup>(std::move(store), rank, size)) {
    const auto device =
        backend->getBackendName() == "nccl" ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
    const auto type = device == c10::DeviceType::CUDA ? c10d::ProcessGroup::BackendType::NCCL
                                                      : c10d::ProcessGroup::BackendType::GLOO;
    group_->setDefaultBackend(type);
    group_->setBackend(device, type, std::move(backend));
  }

  WorkPtr all_gather(at::Tensor& output, at::Tensor& input, Millis timeout) override {
    c10d::AllgatherOptions opts;
    opts.timeout = timeout;
    return group_->all_gather_single(output, input, opts);
  }

  WorkPtr reduce_scatter(at::Tensor& output, at::Tensor& input, c10d::ReduceOp op,
                         Millis timeout) override {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = std::move(op);
    opts.timeout = timeout;
    return group_->reduce_scatter_single(output, input, opts);
  }

  WorkPtr all_to_all(at::Tensor& output, at::Tensor& input, std::vector<std::int64_t> output_splits,
                     std::vector<std::int64_t> input_splits, Millis timeout) override {
    c10d::AllToAllOptions opts;
    opts.timeout = timeout;
    return group_->all_to_all_single(output, input, output_splits, input_splits, opts);
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

class NativeComm final : public internal::CommKernel {
 public:
  internal::Support supports(const internal::CommCall& call) const override {
    return internal::backend_available(call.backend);
  }
  std::unique_ptr<internal::CommEngine> wrap(c10::intrusive_ptr<c10d::Backend> backend,
                                             c10::intrusive_ptr<c10d::Store> store, int rank,
                                             int size) const override {
    return std::make_unique<ProcessGroupEngine>(std::move(backend), std::move(store), rank, size);
  }
};

}  // namespace

const internal::CommKernel& native_comm_kernel() {
  static const NativeComm kernel;
  return kernel;
}

}  // namespace keel::adapters
