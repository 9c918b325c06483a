// The engine every adapter's communicator starts from: c10d's Backend API
// with the collective names every supported release has (`_allgather_base`,
// `_reduce_scatter_base`, `alltoall_base`; from 2.14 forwarding aliases of
// the canonical `*_single` names; see docs/torch-api-matrix.md §3). An
// adapter overrides what its release names differently.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "c10d/c10d_backends.h"
#include "dispatch/comm.h"

namespace keel::adapters {

class C10dEngine : public internal::CommEngine {
 public:
  explicit C10dEngine(c10::intrusive_ptr<c10d::Backend> backend) : backend_(std::move(backend)) {}

  WorkPtr all_reduce(at::Tensor& tensor, c10d::ReduceOp op, Millis timeout) override;
  WorkPtr all_gather(at::Tensor& output, at::Tensor& input, Millis timeout) override;
  WorkPtr all_gather_list(std::vector<at::Tensor>& outputs, at::Tensor& input,
                          Millis timeout) override;
  WorkPtr reduce_scatter(at::Tensor& output, at::Tensor& input, c10d::ReduceOp op,
                         Millis timeout) override;
  WorkPtr broadcast(at::Tensor& tensor, int root, Millis timeout) override;
  WorkPtr all_to_all(at::Tensor& output, at::Tensor& input, std::vector<std::int64_t> output_splits,
                     std::vector<std::int64_t> input_splits, Millis timeout) override;
  WorkPtr send(at::Tensor& tensor, int peer, int tag) override;
  WorkPtr recv(at::Tensor& tensor, int peer, int tag) override;
  WorkPtr barrier(Millis timeout) override;
  void abort() noexcept override;

 protected:
  c10::intrusive_ptr<c10d::Backend> backend_;
};

// What every c10d comm kernel shares: the collectives keel::comm serves on
// the devices this build has, the backends this build has, and c10d's
// failures read as Gloo and NCCL word them. A kernel adds only create() and
// names its `implementation`.
class C10dComm : public internal::CommKernel {
 public:
  explicit C10dComm(const char* implementation);
  const internal::Capability& capability() const noexcept override { return capability_; }
  internal::Support supports(const internal::CommCall& call) const override {
    return internal::backend_available(call.backend);
  }
  Errc classify_failure(const std::string& text) const noexcept override {
    return internal::classify_c10d_failure(text);
  }
  c10::intrusive_ptr<c10d::Store> open_store(const internal::StoreRequest& request) const override;

 private:
  internal::Capability capability_;
};

// A comm kernel whose engine calls c10d::Backend itself (no ProcessGroup):
// wraps each backend in an `Engine`.
template <class Engine>
class C10dEngineComm final : public C10dComm {
 public:
  using C10dComm::C10dComm;
  std::unique_ptr<internal::CommEngine> create(
      const internal::BackendRequest& request) const override {
    return std::make_unique<Engine>(internal::make_backend(request));
  }
};

}  // namespace keel::adapters
