#include "c10d/c10d_engine.h"

#include <utility>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace keel::adapters {

using WorkPtr = internal::CommEngine::WorkPtr;

WorkPtr C10dEngine::all_reduce(at::Tensor& tensor, c10d::ReduceOp op, Millis timeout) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = std::move(op);
  opts.timeout = timeout;
  return backend_->allreduce(tensors, opts);
}

WorkPtr C10dEngine::all_gather(at::Tensor& output, at::Tensor& input, Millis timeout) {
  c10d::AllgatherOptions opts;
  opts.timeout = timeout;
  return backend_->_allgather_base(output, input, opts);
}

WorkPtr C10dEngine::all_gather_list(std::vector<at::Tensor>& outputs, at::Tensor& input,
                                    Millis timeout) {
  std::vector<std::vector<at::Tensor>> out{outputs};
  std::vector<at::Tensor> in{input};
  c10d::AllgatherOptions opts;
  opts.timeout = timeout;
  // c10d copies into the tensors of `out`, which share storage with `outputs`.
  return backend_->allgather(out, in, opts);
}

WorkPtr C10dEngine::reduce_scatter(at::Tensor& output, at::Tensor& input, c10d::ReduceOp op,
                                   Millis timeout) {
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = std::move(op);
  opts.timeout = timeout;
  return backend_->_reduce_scatter_base(output, input, opts);
}

WorkPtr C10dEngine::broadcast(at::Tensor& tensor, int root, Millis timeout) {
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = timeout;
  return backend_->broadcast(tensors, opts);
}

WorkPtr C10dEngine::all_to_all(at::Tensor& output, at::Tensor& input,
                               std::vector<std::int64_t> output_splits,
                               std::vector<std::int64_t> input_splits, Millis timeout) {
  c10d::AllToAllOptions opts;
  opts.timeout = timeout;
  return backend_->alltoall_base(output, input, output_splits, input_splits, opts);
}

WorkPtr C10dEngine::send(at::Tensor& tensor, int peer, int tag) {
  std::vector<at::Tensor> tensors{tensor};
  return backend_->send(tensors, peer, tag);
}

WorkPtr C10dEngine::recv(at::Tensor& tensor, int peer, int tag) {
  std::vector<at::Tensor> tensors{tensor};
  return backend_->recv(tensors, peer, tag);
}

WorkPtr C10dEngine::barrier(Millis timeout) {
  c10d::BarrierOptions opts;
  opts.timeout = timeout;
  return backend_->barrier(opts);
}

void C10dEngine::abort() noexcept {
  try {
    backend_->abort();
  } catch (...) {  // NOLINT(bugprone-empty-catch): abort is best effort by contract
  }
}

c10::intrusive_ptr<c10d::Store> C10dComm::open_store(const internal::StoreRequest& request) const {
  if (!request.path.empty()) {
    return c10::make_intrusive<c10d::FileStore>(request.path, request.world_size);
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(request.port);
  opts.isServer = request.serve;
  opts.waitWorkers = false;  // keel's own arrival names who is missing
  opts.timeout = request.connect_timeout;
  return c10::make_intrusive<c10d::TCPStore>(request.host, opts);
}

C10dComm::C10dComm(const char* implementation) {
  internal::Capability& c = capability_;
  c.operation = "comm";
  c.dtypes = {c10::kHalf, c10::kBFloat16, c10::kFloat, c10::kDouble,
              c10::kChar, c10::kByte,     c10::kInt,   c10::kLong};
  c.devices = internal::comm_devices();
  c.features = {"all_reduce (sum, avg, min, max, product)",
                "all_gather (tensor, list)",
                "reduce_scatter",
                "broadcast",
                "all_to_all (equal, split sizes)",
                "send/recv",
                "barrier",
                "async work",
                "split",
                "dedicated groups",
                "reform",
                "heartbeat liveness",
                "flight recorder",
                "checked mode"};
  c.implementation = implementation;
}

}  // namespace keel::adapters
