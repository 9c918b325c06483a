// Issuing an operation: one order per group on every rank (an operation
// that keel's own thread is still issuing finishes first), a sequence
// number and a flight-recorder entry, checked mode, then the c10d call.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/checked.h"
#include "comm/state.h"
#include "keel/v1/comm.h"

namespace keel {
inline namespace v1 {
namespace comm::detail {

// One operation as issue() takes it.
struct Op {
  std::string name;                    // "all_reduce"
  std::string detail;                  // "(sum)"
  const at::Tensor* tensor = nullptr;  // the one the flight recorder describes
  std::uint64_t bytes = 0;
  bool empty = false;  // nothing to move on any rank: skipped
  bool p2p = false;
  // c10d runs it to completion inside the call (Gloo's reduce_scatter):
  // keel runs the call on a thread of its own and waits for it before
  // returning, so the wait stays bounded and watches the heartbeats. `start`
  // must then own what it captures.
  bool blocking = false;
  std::vector<int> peers;  // world ranks; empty: the whole group
  std::optional<Descriptor> check;
  std::function<void()> finish;
};

// Starts the c10d call with the operation's timeout; may throw (c10::Error).
using Start = std::function<c10::intrusive_ptr<c10d::Work>(Millis)>;

// Issues `op` on `g`: checks the timeout and the group, records, runs checked
// mode, then `start`. A Work whose wait is bounded by the timeout.
result<Work> issue(const std::shared_ptr<GroupState>& g, Op op, const CallOptions& call,
                   const Start& start);
// Waits for `work` (the blocking form of every operation).
result<void> run_sync(result<Work> work);

}  // namespace comm::detail
}  // namespace v1
}  // namespace keel
