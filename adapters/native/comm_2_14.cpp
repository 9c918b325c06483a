// The native communicator from libtorch 2.14 on (see comm.h): c10d::Backend
// has the canonical collective names itself (all_gather_single,
// reduce_scatter_single, all_to_all_single; include/torch/csrc/distributed/
// c10d/Backend.hpp), and the names 2.9 has became forwarding aliases of
// them. No ProcessGroup wrapper is needed.
#include "native/comm.h"

#include <utility>

#include <torch/headeronly/version.h>

#include "c10d/c10d_engine.h"

// 2.13 has these names on c10d::ProcessGroup only: comm_2_13.cpp.
#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 14)
#error \
    "adapters/native/comm_2_14.cpp needs libtorch 2.14 (c10d::Backend::*_single); 2.13 builds comm_2_13.cpp"
#endif

namespace keel::adapters {
namespace {

class CanonicalC10dEngine final : public C10dEngine {
 public:
  using C10dEngine::C10dEngine;

  WorkPtr all_gather(at::Tensor& output, at::Tensor& input, Millis timeout) override {
    c10d::AllgatherOptions opts;
    opts.timeout = timeout;
    return backend_->all_gather_single(output, input, opts);
  }

  WorkPtr reduce_scatter(at::Tensor& output, at::Tensor& input, c10d::ReduceOp op,
                         Millis timeout) override {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = std::move(op);
    opts.timeout = timeout;
    return backend_->reduce_scatter_single(output, input, opts);
  }

  WorkPtr all_to_all(at::Tensor& output, at::Tensor& input, std::vector<std::int64_t> output_splits,
                     std::vector<std::int64_t> input_splits, Millis timeout) override {
    c10d::AllToAllOptions opts;
    opts.timeout = timeout;
    return backend_->all_to_all_single(output, input, output_splits, input_splits, opts);
  }
};

}  // namespace

const internal::CommKernel& native_comm_kernel() {
  static const C10dEngineComm<CanonicalC10dEngine> kernel(
      "c10d::Backend with the canonical names of 2.14 (all_gather_single, "
      "reduce_scatter_single, all_to_all_single); the rest with the names 2.9 has");
  return kernel;
}

}  // namespace keel::adapters
