// The communicator of the C ABI (keel.h, "comm"): creation, each collective
// its own call (sync, or async with a work handle), bounded waits, split,
// reform and abort.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace keel::c_api {
namespace {

std::chrono::milliseconds ms_or(std::int64_t ms, std::chrono::milliseconds otherwise) {
  return ms > 0 ? std::chrono::milliseconds(ms) : otherwise;
}

// A tensor the collective writes: the caller's memory, never read-only.
result<at::Tensor> writable(const DLManagedTensorVersioned* t, const char* name, Inputs& in) {
  if (t != nullptr && (t->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0) {
    return Error(Errc::invalid_argument,
                 std::string(name) + " is read-only, and this collective writes it");
  }
  return in.take(t, name);
}

result<comm::ReduceOp> op_of(std::int32_t op) {
  if (op < KEEL_REDUCE_SUM || op > KEEL_REDUCE_PRODUCT) {
    return Error(Errc::invalid_argument, "op is " + std::to_string(op) + ", not a KEEL_ReduceOp");
  }
  return static_cast<comm::ReduceOp>(op);
}

result<std::vector<std::int64_t>> splits_of(const std::int64_t* p, std::size_t n,
                                            const char* name) {
  if (n > 0 && p == nullptr) {
    return Error(Errc::invalid_argument, std::string(name) + " is NULL with a count");
  }
  return std::vector<std::int64_t>(p, p + n);
}

// A synchronous collective's result as a finished Work.
result<comm::Work> done(result<void> r) {
  if (!r) return r.error();
  return comm::Work();
}

// Runs one collective whose arguments end alike (comm, timeout_ms, async,
// work): `run` reads the call's own arguments into borrowed inputs (which
// an async work keeps alive) and calls v1, synchronously or not.
template <class Args, class Run>
KEEL_Error* collective(const char* call, Args* args, Run&& run) noexcept {
  return guarded(call, [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args));
    Outputs<Args> out(args, &Args::work);
    if (a.comm == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "comm is NULL");
    comm::CallOptions options;
    if (a.timeout_ms > 0) options.timeout = std::chrono::milliseconds(a.timeout_ms);
    Inputs in;
    const bool async = a.async != 0;
    KEEL_TRY(work, run(a, a.comm->comm, options, in, async));
    if (async) {
      out.handle(&Args::work, std::make_unique<KEEL_Work>(KEEL_Work{std::move(work), in.all()}));
    }
    return out.commit();
  });
}

}  // namespace

KEEL_Error* comm_create(KEEL_Comm_Create_Args* args) noexcept {
  return guarded("KEEL_Comm_Create", [&]() -> KEEL_Error* {
    using A = KEEL_Comm_Create_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::comm);
    comm::CommOptions o;
    if (a.backend < KEEL_COMM_AUTOMATIC || a.backend > KEEL_COMM_NCCL) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT,
                        "backend is " + std::to_string(a.backend) + ", not a KEEL_CommBackend");
    }
    o.backend = static_cast<comm::CommBackend>(a.backend);
    if (a.rendezvous != nullptr) o.rendezvous = a.rendezvous;
    if (a.world_size < 0) {
      return make_error(
          KEEL_ERRC_INVALID_ARGUMENT,
          "world_size is " + std::to_string(a.world_size) + "; 0 takes it from the rendezvous");
    }
    if (a.world_size > 0) {
      o.world_size = a.world_size;
      o.rank = a.rank;
    }
    o.timeout = ms_or(a.timeout_ms, o.timeout);
    if (a.name != nullptr) o.name = a.name;
    o.checked = a.checked != 0;
    o.heartbeat_interval = ms_or(a.heartbeat_interval_ms, o.heartbeat_interval);
    o.peer_timeout = ms_or(a.peer_timeout_ms, o.peer_timeout);
    if (a.has_generation != 0) o.generation = a.generation;
    o.rejoin = a.rejoin != 0;
    KEEL_TRY(backend, backend_of(a.dispatch_backend, "dispatch_backend"));
    o.dispatch.backend = backend;
    KEEL_TRY(c, comm::Communicator::create(o));
    out.handle(&A::comm, std::make_unique<KEEL_Comm>(KEEL_Comm{std::move(c)}));
    return out.commit();
  });
}

KEEL_Error* comm_destroy(KEEL_Comm_Destroy_Args* args) noexcept {
  return guarded("KEEL_Comm_Destroy", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args));
    delete a.comm;
    return nullptr;
  });
}

KEEL_Error* comm_info(KEEL_Comm_Info_Args* args) noexcept {
  return guarded("KEEL_Comm_Info", [&]() -> KEEL_Error* {
    using A = KEEL_Comm_Info_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::rank, &A::size, &A::local_rank, &A::generation, &A::aborted, &A::name);
    if (a.comm == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "comm is NULL");
    const comm::Communicator& c = a.comm->comm;
    out.set(&A::rank, c.rank());
    out.set(&A::size, c.size());
    out.set(&A::local_rank, c.local_rank());
    out.set(&A::generation, c.generation());
    out.set(&A::aborted, c.is_aborted() ? 1 : 0);
    out.set(&A::name, c.name().c_str());
    return out.commit();
  });
}

KEEL_Error* comm_all_reduce(KEEL_Comm_AllReduce_Args* args) noexcept {
  return collective("KEEL_Comm_AllReduce", args,
                    [](const KEEL_Comm_AllReduce_Args& a, comm::Communicator& c,
                       const comm::CallOptions& o, Inputs& in, bool async) -> result<comm::Work> {
                      KEEL_TRY_RESULT(op, op_of(a.op));
                      KEEL_TRY_RESULT(t, writable(a.tensor, "tensor", in));
                      return async ? c.all_reduce_async(t, op, o) : done(c.all_reduce(t, op, o));
                    });
}

KEEL_Error* comm_broadcast(KEEL_Comm_Broadcast_Args* args) noexcept {
  return collective("KEEL_Comm_Broadcast", args,
                    [](const KEEL_Comm_Broadcast_Args& a, comm::Communicator& c,
                       const comm::CallOptions& o, Inputs& in, bool async) -> result<comm::Work> {
                      KEEL_TRY_RESULT(t, writable(a.tensor, "tensor", in));
                      return async ? c.broadcast_async(t, a.root, o)
                                   : done(c.broadcast(t, a.root, o));
                    });
}

KEEL_Error* comm_all_gather(KEEL_Comm_AllGather_Args* args) noexcept {
  return collective("KEEL_Comm_AllGather", args,
                    [](const KEEL_Comm_AllGather_Args& a, comm::Communicator& c,
                       const comm::CallOptions& o, Inputs& in, bool async) -> result<comm::Work> {
                      KEEL_TRY_RESULT(output, writable(a.output, "output", in));
                      KEEL_TRY_RESULT(input, in.take(a.input, "input"));
                      return async ? c.all_gather_async(output, input, o)
                                   : done(c.all_gather(output, input, o));
                    });
}

KEEL_Error* comm_reduce_scatter(KEEL_Comm_ReduceScatter_Args* args) noexcept {
  return collective("KEEL_Comm_ReduceScatter", args,
                    [](const KEEL_Comm_ReduceScatter_Args& a, comm::Communicator& c,
                       const comm::CallOptions& o, Inputs& in, bool async) -> result<comm::Work> {
                      KEEL_TRY_RESULT(op, op_of(a.op));
                      KEEL_TRY_RESULT(output, writable(a.output, "output", in));
                      KEEL_TRY_RESULT(input, in.take(a.input, "input"));
                      return async ? c.reduce_scatter_async(output, input, op, o)
                                   : done(c.reduce_scatter(output, input, op, o));
                    });
}

KEEL_Error* comm_all_to_all(KEEL_Comm_AllToAll_Args* args) noexcept {
  return collective(
      "KEEL_Comm_AllToAll", args,
      [](const KEEL_Comm_AllToAll_Args& a, comm::Communicator& c, const comm::CallOptions& o,
         Inputs& in, bool async) -> result<comm::Work> {
        KEEL_TRY_RESULT(output, writable(a.output, "output", in));
        KEEL_TRY_RESULT(input, in.take(a.input, "input"));
        KEEL_TRY_RESULT(os, splits_of(a.output_splits, a.num_output_splits, "output_splits"));
        KEEL_TRY_RESULT(is, splits_of(a.input_splits, a.num_input_splits, "input_splits"));
        return async ? c.all_to_all_async(output, input, os, is, o)
                     : done(c.all_to_all(output, input, os, is, o));
      });
}

KEEL_Error* comm_send(KEEL_Comm_Send_Args* args) noexcept {
  return collective("KEEL_Comm_Send", args,
                    [](const KEEL_Comm_Send_Args& a, comm::Communicator& c,
                       const comm::CallOptions& o, Inputs& in, bool async) -> result<comm::Work> {
                      KEEL_TRY_RESULT(t, in.take(a.tensor, "tensor"));
                      return async ? c.send_async(t, a.peer, a.tag, o)
                                   : done(c.send(t, a.peer, a.tag, o));
                    });
}

KEEL_Error* comm_recv(KEEL_Comm_Recv_Args* args) noexcept {
  return collective("KEEL_Comm_Recv", args,
                    [](const KEEL_Comm_Recv_Args& a, comm::Communicator& c,
                       const comm::CallOptions& o, Inputs& in, bool async) -> result<comm::Work> {
                      KEEL_TRY_RESULT(t, writable(a.tensor, "tensor", in));
                      return async ? c.recv_async(t, a.peer, a.tag, o)
                                   : done(c.recv(t, a.peer, a.tag, o));
                    });
}

KEEL_Error* comm_barrier(KEEL_Comm_Barrier_Args* args) noexcept {
  return guarded("KEEL_Comm_Barrier", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args));
    if (a.comm == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "comm is NULL");
    comm::CallOptions options;
    if (a.timeout_ms > 0) options.timeout = std::chrono::milliseconds(a.timeout_ms);
    result<void> r = a.comm->comm.barrier(options);
    return r ? nullptr : to_c(r.error());
  });
}

KEEL_Error* work_wait(KEEL_Work_Wait_Args* args) noexcept {
  return guarded("KEEL_Work_Wait", [&]() -> KEEL_Error* {
    using A = KEEL_Work_Wait_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::completed);
    if (a.work == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "work is NULL");
    if (a.poll == 0) {
      std::optional<std::chrono::milliseconds> timeout;
      if (a.timeout_ms > 0) timeout = std::chrono::milliseconds(a.timeout_ms);
      result<void> r = a.work->work.wait(timeout);
      if (!r) return to_c(r.error());
    }
    out.set(&A::completed, a.work->work.is_completed() ? 1 : 0);
    return out.commit();
  });
}

KEEL_Error* work_destroy(KEEL_Work_Destroy_Args* args) noexcept {
  return guarded("KEEL_Work_Destroy", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args));
    delete a.work;
    return nullptr;
  });
}

KEEL_Error* comm_split(KEEL_Comm_Split_Args* args) noexcept {
  return guarded("KEEL_Comm_Split", [&]() -> KEEL_Error* {
    using A = KEEL_Comm_Split_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::split);
    if (a.comm == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "comm is NULL");
    if (a.num_ranks > 0 && a.ranks == nullptr) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "ranks is NULL with num_ranks > 0");
    }
    const std::vector<int> ranks(a.ranks, a.ranks + a.num_ranks);
    KEEL_TRY(sub, a.comm->comm.split(ranks, a.name != nullptr ? a.name : ""));
    out.handle(&A::split, std::make_unique<KEEL_Comm>(KEEL_Comm{std::move(sub)}));
    return out.commit();
  });
}

KEEL_Error* comm_reform(KEEL_Comm_Reform_Args* args) noexcept {
  return guarded("KEEL_Comm_Reform", [&]() -> KEEL_Error* {
    using A = KEEL_Comm_Reform_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::reformed);
    if (a.comm == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "comm is NULL");
    comm::ReformOptions o;
    if (a.timeout_ms > 0) o.timeout = std::chrono::milliseconds(a.timeout_ms);
    o.wait_for_replacements = a.wait_for_replacements != 0;
    KEEL_TRY(world, a.comm->comm.reform(o));
    out.handle(&A::reformed, std::make_unique<KEEL_Comm>(KEEL_Comm{std::move(world)}));
    return out.commit();
  });
}

KEEL_Error* comm_abort(KEEL_Comm_Abort_Args* args) noexcept {
  return guarded("KEEL_Comm_Abort", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args));
    if (a.comm == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "comm is NULL");
    a.comm->comm.abort();
    return nullptr;
  });
}

}  // namespace keel::c_api
