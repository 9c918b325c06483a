// The communicator capability: what an adapter gives the core for one group.
// The core (src/comm/) owns rendezvous, liveness, timeouts, checks and the
// flight recorder; an adapter only issues c10d collectives under the names
// its libtorch release has.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "dispatch/adapter.h"
#include "keel/v1/comm.h"
#include "keel/v1/error.h"

namespace keel::internal {

// One group's collectives. Every call may throw (c10::Error and friends);
// the core turns that into a keel::Error. `timeout` is the operation's bound,
// handed to c10d as well (the core enforces it regardless).
class CommEngine {
 public:
  using WorkPtr = c10::intrusive_ptr<c10d::Work>;
  using Millis = std::chrono::milliseconds;

  virtual ~CommEngine() = default;

  virtual WorkPtr all_reduce(at::Tensor& tensor, c10d::ReduceOp op, Millis timeout) = 0;
  virtual WorkPtr all_gather(at::Tensor& output, at::Tensor& input, Millis timeout) = 0;
  virtual WorkPtr all_gather_list(std::vector<at::Tensor>& outputs, at::Tensor& input,
                                  Millis timeout) = 0;
  virtual WorkPtr reduce_scatter(at::Tensor& output, at::Tensor& input, c10d::ReduceOp op,
                                 Millis timeout) = 0;
  virtual WorkPtr broadcast(at::Tensor& tensor, int root, Millis timeout) = 0;
  virtual WorkPtr all_to_all(at::Tensor& output, at::Tensor& input,
                             std::vector<std::int64_t> output_splits,
                             std::vector<std::int64_t> input_splits, Millis timeout) = 0;
  virtual WorkPtr send(at::Tensor& tensor, int peer, int tag) = 0;
  virtual WorkPtr recv(at::Tensor& tensor, int peer, int tag) = 0;
  virtual WorkPtr barrier(Millis timeout) = 0;
  // Best effort, never throws: c10d's Backend::abort (NCCL aborts its
  // communicators; Gloo's is a no-op before 2.13).
  virtual void abort() noexcept = 0;
};

// What the core asks before it builds a group.
struct CommCall {
  comm::CommBackend backend;  // gloo or nccl, never automatic
};

// One group's backend, as the core asks for it once every rank arrived.
struct BackendRequest {
  comm::CommBackend backend = comm::CommBackend::gloo;  // never automatic
  c10::intrusive_ptr<c10d::Store> store;                // already prefixed for this group
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  std::string host;  // the address peers reach this rank at (Gloo)
  c10::Device device = c10::kCPU;
  std::string group_name;
};

// The store a world rendezvouses in, as the core planned it: a file shared
// by `world_size` ranks, or a TCP host:port this rank serves (`serve`) or
// joins. `connect_timeout` bounds c10d's own connect and wait.
struct StoreRequest {
  std::string path;  // non-empty: a FileStore
  std::string host;
  int port = 0;
  bool serve = false;
  int world_size = 1;
  std::chrono::milliseconds connect_timeout{0};
};

class CommKernel {
 public:
  virtual ~CommKernel() = default;
  // What it serves, for keel-info.
  virtual const Capability& capability() const noexcept = 0;
  // Whether this build and machine have `call.backend` (Gloo compiled in;
  // NCCL compiled in with a GPU): a fact of the environment, not of the
  // capability's lists.
  virtual Support supports(const CommCall& call) const = 0;
  // Builds the c10d backend `request` names and the engine that calls it.
  // c10d's backend construction and its Options change between releases,
  // so they live behind this call. May throw (c10::Error): the core guards
  // it.
  virtual std::unique_ptr<CommEngine> create(const BackendRequest& request) const = 0;
  // Opens the store `request` names (c10d's FileStore or TCPStore, whose
  // options are the release's). May throw (c10::Error): the core guards it
  // and reads the failure through classify_failure().
  virtual c10::intrusive_ptr<c10d::Store> open_store(const StoreRequest& request) const = 0;
  // Classifies the text of an exception c10d left on a work or threw:
  // timeout, peer_lost, or backend_error. c10d reports failures as message
  // text only, and its wording is the release's, so the reading is the
  // adapter's. Never throws.
  virtual Errc classify_failure(const std::string& text) const noexcept = 0;
};

}  // namespace keel::internal
