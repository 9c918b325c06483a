// keel::comm::Communicator's operations and Work. Each operation checks its
// arguments (comm/validation.h), describes itself (an Op, with its
// checked-mode descriptor), and issues (comm/issue.h); waiting is
// comm/waiting.h, groups comm/groups.cpp. The adapters (adapters/*/comm.cpp)
// only issue c10d collectives.
#include "keel/v1/comm.h"

#include <mutex>

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include "comm/checked.h"
#include "comm/issue.h"
#include "comm/state.h"
#include "comm/validation.h"
#include "comm/waiting.h"
#include "keel/v1/dtype.h"
#include "string_view_bridge.h"

namespace keel {
inline namespace v1 {
namespace comm {

using detail::Clock;
using detail::GroupState;
using detail::invalid;
using detail::Millis;
using detail::Op;
using detail::WorkState;
using internal::to_absl;

std::string_view to_string(CommBackend backend) noexcept {
  switch (backend) {
    case CommBackend::automatic:
      return "auto";
    case CommBackend::gloo:
      return "gloo";
    case CommBackend::nccl:
      return "nccl";
  }
  return "unknown";
}

std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::product:
      return "product";
  }
  return "unknown";
}

// --- Work ---------------------------------------------------------------

result<void> Work::wait(std::optional<std::chrono::milliseconds> timeout) {
  if (!state_) return invalid("Work::wait", "an empty Work (not returned by an operation)");
  WorkState& w = *state_;
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.outcome) return *w.outcome;
  if (timeout && timeout->count() <= 0) {
    return invalid("Work::wait", absl::StrCat("timeout: expected > 0 ms, got ", timeout->count()));
  }
  const auto deadline = timeout ? std::min(w.deadline, Clock::now() + *timeout) : w.deadline;
  result<void> r = detail::wait_work(w, deadline);
  w.outcome = r;
  if (!w.done.exchange(true)) w.group->pending.fetch_sub(1);
  return r;
}

bool Work::is_completed() const noexcept {
  if (!state_) return false;
  if (state_->done.load()) return true;
  try {
    if (state_->group->aborted.load()) return true;
    if (state_->thread) {
      std::lock_guard<std::mutex> lock(state_->thread->mutex);
      return state_->thread->finished;
    }
    return !state_->work || state_->work->isCompleted();
  } catch (...) {
    return true;
  }
}

int Communicator::rank() const noexcept {
  return state_->rank;
}
int Communicator::size() const noexcept {
  return state_->size;
}
int Communicator::local_rank() const noexcept {
  return state_->world->plan.local_rank;
}
const std::string& Communicator::name() const noexcept {
  return state_->name;
}
int Communicator::generation() const noexcept {
  return state_->world->generation;
}
const std::vector<int>& Communicator::world_ranks() const noexcept {
  return state_->world_ranks;
}
const DispatchInfo& Communicator::dispatch_info() const noexcept {
  return state_->world->dispatch;
}

result<Work> Communicator::all_reduce_async(at::Tensor& tensor, ReduceOp op,
                                            const CallOptions& call) {
  const char* name = "all_reduce";
  auto ok = detail::check_tensor(*state_, name, "tensor", tensor);
  if (!ok) return ok.error();
  ok = detail::check_reduce_op(name, op, tensor);
  if (!ok) return ok.error();
  Op operation;
  operation.name = name;
  operation.detail = absl::StrCat("(", to_absl(to_string(op)), ")");
  operation.tensor = &tensor;
  operation.bytes = detail::nbytes(tensor);
  operation.empty = tensor.numel() == 0;
  operation.check = detail::describe_tensor_call(tensor, operation.detail);
  if (op == ReduceOp::avg) {
    operation.finish = [t = tensor, n = state_->size]() mutable { t.div_(n); };
  }
  at::Tensor t = tensor;
  return detail::issue(state_, std::move(operation), call, [&](Millis timeout) {
    return state_->engine->all_reduce(t, detail::to_c10d(op), timeout);
  });
}

result<void> Communicator::all_reduce(at::Tensor& tensor, ReduceOp op, const CallOptions& call) {
  return detail::run_sync(all_reduce_async(tensor, op, call));
}

result<Work> Communicator::all_gather_async(at::Tensor& output, const at::Tensor& input,
                                            const CallOptions& call) {
  const char* name = "all_gather";
  auto ok = detail::check_tensor(*state_, name, "input", input);
  if (!ok) return ok.error();
  ok = detail::check_tensor(*state_, name, "output", output);
  if (!ok) return ok.error();
  ok = detail::check_same_dtype(name, output, input);
  if (!ok) return ok.error();
  const std::int64_t n = state_->size;
  auto expected = input.sizes().vec();
  if (expected.empty()) expected.push_back(1);
  expected[0] *= n;
  if (output.sizes().vec() != expected) {
    return invalid(
        name, absl::StrCat("output: expected [", absl::StrJoin(expected, ", "),
                           "] (size() * input.size(0) rows), got ", internal::shape_text(output)));
  }
  Op operation;
  operation.name = name;
  operation.tensor = &input;
  operation.bytes = detail::nbytes(output);
  operation.empty = input.numel() == 0;
  operation.check = detail::describe_tensor_call(input);
  at::Tensor out = output;
  at::Tensor in = input;
  return detail::issue(state_, std::move(operation), call, [&](Millis timeout) {
    return state_->engine->all_gather(out, in, timeout);
  });
}

result<void> Communicator::all_gather(at::Tensor& output, const at::Tensor& input,
                                      const CallOptions& call) {
  return detail::run_sync(all_gather_async(output, input, call));
}

result<Work> Communicator::all_gather_async(std::vector<at::Tensor>& outputs,
                                            const at::Tensor& input, const CallOptions& call) {
  const char* name = "all_gather";
  auto ok = detail::check_tensor(*state_, name, "input", input);
  if (!ok) return ok.error();
  if (outputs.size() != static_cast<std::size_t>(state_->size)) {
    return invalid(name, absl::StrCat("outputs: expected ", state_->size,
                                      " tensors (one per rank), got ", outputs.size()));
  }
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    const std::string arg = absl::StrCat("outputs[", r, "]");
    ok = detail::check_tensor(*state_, name, arg, outputs[r]);
    if (!ok) return ok.error();
    if (outputs[r].sizes() != input.sizes() || outputs[r].scalar_type() != input.scalar_type()) {
      return invalid(
          name, absl::StrCat(arg, ": expected ", keel::dtype_name(input), " ",
                             internal::shape_text(input), " (input's), got ",
                             keel::dtype_name(outputs[r]), " ", internal::shape_text(outputs[r])));
    }
  }
  Op operation;
  operation.name = name;
  operation.detail = "(list)";
  operation.tensor = &input;
  operation.bytes = detail::nbytes(input) * static_cast<std::uint64_t>(state_->size);
  operation.empty = input.numel() == 0;
  operation.check = detail::describe_tensor_call(input, operation.detail);
  std::vector<at::Tensor> outs = outputs;
  at::Tensor in = input;
  return detail::issue(state_, std::move(operation), call, [&](Millis timeout) {
    return state_->engine->all_gather_list(outs, in, timeout);
  });
}

result<void> Communicator::all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                      const CallOptions& call) {
  return detail::run_sync(all_gather_async(outputs, input, call));
}

result<Work> Communicator::reduce_scatter_async(at::Tensor& output, const at::Tensor& input,
                                                ReduceOp op, const CallOptions& call) {
  const char* name = "reduce_scatter";
  auto ok = detail::check_tensor(*state_, name, "input", input);
  if (!ok) return ok.error();
  ok = detail::check_tensor(*state_, name, "output", output);
  if (!ok) return ok.error();
  ok = detail::check_same_dtype(name, output, input);
  if (!ok) return ok.error();
  ok = detail::check_reduce_op(name, op, input);
  if (!ok) return ok.error();
  auto expected = output.sizes().vec();
  if (expected.empty()) expected.push_back(1);
  expected[0] *= state_->size;
  if (input.sizes().vec() != expected) {
    return invalid(
        name, absl::StrCat("input: expected [", absl::StrJoin(expected, ", "),
                           "] (size() * output.size(0) rows), got ", internal::shape_text(input)));
  }
  Op operation;
  operation.name = name;
  operation.detail = absl::StrCat("(", to_absl(to_string(op)), ")");
  operation.tensor = &input;
  operation.bytes = detail::nbytes(input);
  operation.empty = input.numel() == 0;
  operation.check = detail::describe_tensor_call(input, operation.detail);
  if (op == ReduceOp::avg) {
    operation.finish = [t = output, n = state_->size]() mutable { t.div_(n); };
  }
  // Gloo's _reduce_scatter_base finishes inside the call (an allreduce it
  // waits on), so keel runs it on a thread of its own (Op::blocking).
  operation.blocking = state_->world->backend == CommBackend::gloo;
  return detail::issue(state_, std::move(operation), call,
                       [g = state_, out = output, in = input, op](Millis timeout) mutable {
                         return g->engine->reduce_scatter(out, in, detail::to_c10d(op), timeout);
                       });
}

result<void> Communicator::reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                          const CallOptions& call) {
  return detail::run_sync(reduce_scatter_async(output, input, op, call));
}

result<Work> Communicator::broadcast_async(at::Tensor& tensor, int root, const CallOptions& call) {
  const char* name = "broadcast";
  auto ok = detail::check_tensor(*state_, name, "tensor", tensor);
  if (!ok) return ok.error();
  if (root < 0 || root >= state_->size) {
    return invalid(name, absl::StrCat("root: expected in [0, ", state_->size, "), got ", root));
  }
  Op operation;
  operation.name = name;
  operation.detail = absl::StrCat("(root ", root, ")");
  operation.tensor = &tensor;
  operation.bytes = detail::nbytes(tensor);
  operation.empty = tensor.numel() == 0;
  operation.check = detail::describe_tensor_call(tensor, operation.detail);
  at::Tensor t = tensor;
  return detail::issue(state_, std::move(operation), call,
                       [&](Millis timeout) { return state_->engine->broadcast(t, root, timeout); });
}

result<void> Communicator::broadcast(at::Tensor& tensor, int root, const CallOptions& call) {
  return detail::run_sync(broadcast_async(tensor, root, call));
}

result<Work> Communicator::all_to_all_async(at::Tensor& output, const at::Tensor& input,
                                            const std::vector<std::int64_t>& output_splits,
                                            const std::vector<std::int64_t>& input_splits,
                                            const CallOptions& call) {
  const char* name = "all_to_all";
  auto ok = detail::check_tensor(*state_, name, "input", input);
  if (!ok) return ok.error();
  ok = detail::check_tensor(*state_, name, "output", output);
  if (!ok) return ok.error();
  ok = detail::check_same_dtype(name, output, input);
  if (!ok) return ok.error();
  if (input.dim() == 0 || output.dim() == 0) {
    return invalid(name, "input and output: need at least one dimension (rows are split)");
  }
  const std::int64_t n = state_->size;
  Op operation;
  operation.name = name;
  operation.tensor = &input;
  operation.bytes = detail::nbytes(input);
  if (output_splits.empty() && input_splits.empty()) {
    if (input.size(0) % n != 0) {
      return invalid(name, absl::StrCat("input: dim 0 (", input.size(0),
                                        ") must divide by size() (", n, ") for equal splits"));
    }
    if (output.sizes() != input.sizes()) {
      return invalid(name,
                     absl::StrCat("output: expected input's shape ", internal::shape_text(input),
                                  " for equal splits, got ", internal::shape_text(output)));
    }
    operation.empty = input.numel() == 0;
    operation.check = detail::describe_tensor_call(input, "(equal)");
  } else {
    auto check_splits = [&](const char* arg, const std::vector<std::int64_t>& s,
                            const at::Tensor& t, const char* tensor_arg) -> result<void> {
      if (s.size() != static_cast<std::size_t>(n)) {
        return invalid(
            name, absl::StrCat(arg, ": expected ", n, " sizes (one per rank), got ", s.size()));
      }
      std::int64_t total = 0;
      for (std::size_t r = 0; r < s.size(); ++r) {
        if (s[r] < 0) return invalid(name, absl::StrCat(arg, "[", r, "]: negative (", s[r], ")"));
        total += s[r];
      }
      if (total != t.size(0)) {
        return invalid(name, absl::StrCat(arg, ": sums to ", total, " rows, but ", tensor_arg,
                                          " has ", t.size(0)));
      }
      return success();
    };
    ok = check_splits("output_splits", output_splits, output, "output");
    if (!ok) return ok.error();
    ok = check_splits("input_splits", input_splits, input, "input");
    if (!ok) return ok.error();
    if (detail::trailing_text(output) != detail::trailing_text(input)) {
      return invalid(name, absl::StrCat("output: trailing dims ", detail::trailing_text(output),
                                        " differ from input's ", detail::trailing_text(input)));
    }
    operation.detail = "(splits)";
    operation.check = detail::pairwise(input, input_splits, output_splits);
  }
  at::Tensor out = output;
  at::Tensor in = input;
  return detail::issue(state_, std::move(operation), call, [&](Millis timeout) {
    return state_->engine->all_to_all(out, in, output_splits, input_splits, timeout);
  });
}

result<void> Communicator::all_to_all(at::Tensor& output, const at::Tensor& input,
                                      const std::vector<std::int64_t>& output_splits,
                                      const std::vector<std::int64_t>& input_splits,
                                      const CallOptions& call) {
  return detail::run_sync(all_to_all_async(output, input, output_splits, input_splits, call));
}

namespace {

// send and recv: the same checks and record, one direction each.
result<Work> p2p_async(const std::shared_ptr<GroupState>& g, bool sending, const at::Tensor& tensor,
                       int peer, int tag, const CallOptions& call) {
  const char* name = sending ? "send" : "recv";
  auto ok = detail::check_tensor(*g, name, "tensor", tensor);
  if (!ok) return ok.error();
  ok = detail::check_peer(*g, name, peer, tag);
  if (!ok) return ok.error();
  Op operation;
  operation.name = name;
  operation.detail = absl::StrCat(sending ? "(to " : "(from ", peer, ", tag ", tag, ")");
  operation.tensor = &tensor;
  operation.bytes = detail::nbytes(tensor);
  operation.empty = tensor.numel() == 0;
  operation.p2p = true;
  operation.peers = {g->world_ranks[static_cast<std::size_t>(peer)]};
  at::Tensor t = tensor;
  return detail::issue(g, std::move(operation), call, [&](Millis /*timeout*/) {
    return sending ? g->engine->send(t, peer, tag) : g->engine->recv(t, peer, tag);
  });
}

}  // namespace

result<Work> Communicator::send_async(const at::Tensor& tensor, int peer, int tag,
                                      const CallOptions& call) {
  return p2p_async(state_, true, tensor, peer, tag, call);
}

result<void> Communicator::send(const at::Tensor& tensor, int peer, int tag,
                                const CallOptions& call) {
  return detail::run_sync(send_async(tensor, peer, tag, call));
}

result<Work> Communicator::recv_async(at::Tensor& tensor, int peer, int tag,
                                      const CallOptions& call) {
  return p2p_async(state_, false, tensor, peer, tag, call);
}

result<void> Communicator::recv(at::Tensor& tensor, int peer, int tag, const CallOptions& call) {
  return detail::run_sync(recv_async(tensor, peer, tag, call));
}

result<void> Communicator::barrier(const CallOptions& call) {
  Op operation;
  operation.name = "barrier";
  operation.check = detail::Descriptor{};
  operation.check->call = "barrier";
  return detail::run_sync(detail::issue(state_, std::move(operation), call, [&](Millis timeout) {
    return state_->engine->barrier(timeout);
  }));
}

void Communicator::abort() noexcept {
  state_->abort_with("abort() was called");
}

bool Communicator::is_aborted() const noexcept {
  return state_->aborted.load();
}

std::string Communicator::flight_recorder_json() const {
  return state_->recorder->json(state_->name, state_->rank, state_->size,
                                state_->world->generation);
}

result<std::string> Communicator::dump_flight_recorder(const std::string& path) const {
  return detail::write_trace(*state_, path);
}

}  // namespace comm
}  // namespace v1
}  // namespace keel
