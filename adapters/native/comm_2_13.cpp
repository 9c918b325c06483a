// The native communicator on libtorch 2.13 (see comm.h): the three
// collectives 2.13 renamed live on c10d::ProcessGroup only.
#include "native/comm.h"

#include <utility>

#include <torch/headeronly/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "c10d/c10d_engine.h"

// 2.14 moved the canonical names onto c10d::Backend: comm_2_14.cpp.
#if TORCH_VERSION_MAJOR != 2 || TORCH_VERSION_MINOR != 13
#error \
    "adapters/native/comm_2_13.cpp is for libtorch 2.13 (ProcessGroup::*_single); 2.14+ builds comm_2_14.cpp"
#endif

namespace keel::adapters {
namespace {

class ProcessGroupEngine final : public C10dEngine {
 public:
  ProcessGroupEngine(c10::intrusive_ptr<c10d::Backend> backend,
                     c10::intrusive_ptr<c10d::Store> store, int rank, int size)
      : C10dEngine(backend),
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

class NativeComm final : public C10dComm {
 public:
  NativeComm()
      : C10dComm(
            "c10d::ProcessGroup with 2.13's names (all_gather_single, reduce_scatter_single, "
            "all_to_all_single); the rest on c10d::Backend") {}
  std::unique_ptr<internal::CommEngine> create(
      const internal::BackendRequest& request) const override {
    return std::make_unique<ProcessGroupEngine>(internal::make_backend(request), request.store,
                                                request.rank, request.size);
  }
};

}  // namespace

const internal::CommKernel& native_comm_kernel() {
  static const NativeComm kernel;
  return kernel;
}

}  // namespace keel::adapters
