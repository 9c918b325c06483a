/// @file keel/v1/comm.h
/// @brief `keel::comm::Communicator`: torchcomms-shaped collectives on c10d
/// that never hang, name the dead peer, and re-form.
///
/// A `Communicator` is one group of processes (ranks) that run collectives
/// together. keel builds it on c10d, PyTorch's engine: Gloo for CPU tensors,
/// NCCL for CUDA tensors (in a CUDA build). It rendezvouses as torchrun and
/// Slurm expect, so a service runs unchanged under either.
///
/// In one line:
/// `auto comm = keel::comm::Communicator::create(options);`
/// then `comm.value().all_reduce(t, keel::comm::ReduceOp::sum);`.
///
/// In full:
///
/// @snippet examples/snippets/header_snippets.cpp comm_all_reduce
///
/// Faults are bounded and named:
/// - Every wait ends: by completion, by the call's timeout (`Errc::timeout`),
///   by a peer's death (`Errc::peer_lost`, naming the rank: each rank
///   publishes a heartbeat in the rendezvous store, and a rank whose
///   heartbeat stops for `CommOptions::peer_timeout` is lost), or by
///   `abort()` (`Errc::aborted`). A rank that hangs with its sockets open
///   (stopped, swapping, stuck in a driver) stops its heartbeat too, so it
///   is named within the same bound, never after the operation's timeout.
///   A peer that destroyed its communicator has finished its part of every
///   operation it issued, but its data may still be in flight on a slow or
///   lossy link: an operation still waiting on it names it as left after
///   one more `peer_timeout` (sooner when its connections report closed).
/// - A failed operation leaves the group in an unknown state, so it aborts
///   the communicator: every later call returns `Errc::aborted`, naming the
///   first failure. Build a new group with `reform()`.
/// - On failure the communicator writes its flight recorder (the last
///   operations, as JSON) to `KEEL_COMM_TRACE_DIR` (default: the system's
///   temporary directory) and names the file in the error message.
///
/// Traps:
/// - Every call's `keel::result` is `[[nodiscard]]`: ignoring one is a
///   warning (an error under `-Werror`); drop one on purpose with `(void)`.
/// - Every rank of a group must issue the same operations in the same order
///   with matching shapes and dtypes, as in c10d. With `CommOptions::checked`
///   (or `KEEL_COMM_CHECK=1`) keel verifies shapes and dtypes first, by a
///   metadata exchange through the store, and returns `invalid_argument`
///   naming the ranks that differ.
/// - Operations work in place on the tensors given; after a failure their
///   contents are unspecified.
/// - `ReduceOp::avg` needs a floating dtype (keel sums, then divides).
/// - Every tensor a collective or send/recv takes must be defined, dense
///   (not sparse or quantized), contiguous and on the communicator's device
///   (`CommOptions::device`); anything else is `invalid_argument` naming the
///   argument, before anything is sent. A non-contiguous view is refused,
///   not copied: call `.contiguous()` and copy back, so that in-place
///   results land where you expect. Outputs have the input's dtype and the
///   shape each operation states.
/// - A `Communicator` is a shared handle: copies refer to the same group.
///   Calls on one group are serialised; groups are independent, so a
///   dedicated group runs concurrently with its parent.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "keel/v1/dispatch.h"
#include "keel/v1/error.h"
#include "keel/v1/export.h"

namespace keel {
inline namespace v1 {
namespace comm {

namespace detail {
struct GroupState;
struct WorkState;
struct Access;
}  // namespace detail

/// Which c10d backend carries the collectives.
enum class CommBackend : std::uint8_t {
  /// Gloo for a CPU `device`, NCCL for a CUDA one.
  automatic,
  /// c10d's ProcessGroupGloo (CPU tensors).
  gloo,
  /// c10d's ProcessGroupNCCL (CUDA tensors; CUDA builds only).
  nccl,
};

/// The name used in messages: "auto", "gloo" or "nccl".
KEEL_API std::string_view to_string(CommBackend backend) noexcept;

/// How `all_reduce` and `reduce_scatter` combine values.
enum class ReduceOp : std::uint8_t {
  /// Elementwise sum.
  sum,
  /// Elementwise mean over the ranks (floating dtypes only).
  avg,
  /// Elementwise minimum.
  min,
  /// Elementwise maximum.
  max,
  /// Elementwise product.
  product,
};

/// The name used in messages and the flight recorder, e.g. "sum".
KEEL_API std::string_view to_string(ReduceOp op) noexcept;

/// How a communicator is made.
struct CommOptions {
  /// The c10d backend.
  CommBackend backend = CommBackend::automatic;
  /// Where the tensors live: CPU for Gloo, a CUDA device for NCCL.
  at::Device device = at::kCPU;
  /// How ranks find each other:
  /// - `"env://"`: torchrun's `MASTER_ADDR`, `MASTER_PORT`, `RANK`,
  ///   `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`; when `RANK` and
  ///   `WORLD_SIZE` are absent, Slurm's `SLURM_PROCID`, `SLURM_NTASKS`,
  ///   `SLURM_LOCALID` (with `MASTER_ADDR` still required, and
  ///   `MASTER_PORT` 29500 when unset);
  /// - `"tcp://host:port"`: a TCP store at host:port, hosted by rank 0
  ///   (or by torchrun's agent when `TORCHELASTIC_USE_AGENT_STORE=True`);
  /// - `"tcp://host:port?store=external"`: a TCP store that a process of
  ///   the job's own hosts, such as `keel-store --port P`, which keel
  ///   installs beside `keel-info` (one per job, as torchrun's agent
  ///   makes one per rendezvous: a store keeps the keys of earlier jobs,
  ///   which a new job of the same `name` would read);
  /// - `"file://path"`: a store in a file on a filesystem all ranks share.
  ///
  /// Where the store lives decides which deaths the others survive. Hosted
  /// outside the ranks (torchrun's agent, keel-store), any rank may die,
  /// rank 0 included, and the survivors `reform()`. Hosted by rank 0 (the
  /// default for a job started by hand), rank 0's death takes the store
  /// with it: the others get `peer_lost` naming rank 0, and cannot re-form.
  std::string rendezvous = "env://";
  /// This process's rank; overrides the environment.
  std::optional<int> rank;
  /// The number of ranks; overrides the environment.
  std::optional<int> world_size;
  /// The bound on creation and on every operation without its own timeout.
  /// When the store cannot be reached or a rank does not arrive,
  /// `create()` fails with `timeout` within it plus 1 s: reaching the store
  /// and every rank's arrival share one deadline, and rank 0, which hosts
  /// the store, may stay up to 1 s more, until the ranks that came have
  /// read which ones did not.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  /// The group's name: separates independent groups on one store, and names
  /// the group in logs and the flight recorder.
  std::string name = "world";
  /// Verify shapes and dtypes across ranks before each operation (a store
  /// round trip per operation). `KEEL_COMM_CHECK=1` turns it on too.
  bool checked = false;
  /// How many recent operations the flight recorder keeps (at least 1).
  std::size_t flight_recorder_entries = 256;
  /// How often this rank publishes its heartbeat.
  std::chrono::milliseconds heartbeat_interval{100};
  /// A peer whose heartbeat has not moved for this long is lost.
  std::chrono::milliseconds peer_timeout{1500};
  /// The generation this group starts at. Unset: torchrun's
  /// `TORCHELASTIC_RESTART_COUNT`, else 0. A restarted world uses a new
  /// generation, so that it never reads the keys of the one before.
  std::optional<int> generation;
  /// This process replaces a rank of a running world: a restart of a rank
  /// that died, started by torchrun's agent, Slurm or a supervisor with the
  /// same `rendezvous`, `name`, `rank` and restart count as the process it
  /// replaces. `create()` finds the world's newest generation in the store,
  /// takes `rank`'s seat in the next one and waits (within `timeout`) until
  /// the survivors form it with `ReformOptions::wait_for_replacements`; if
  /// they form it without this rank, it waits for the one after. Fails with
  /// `timeout` when no generation takes it in time, and `invalid_argument`
  /// when another process holds the seat (the rank is still alive, or two
  /// replacements were started) or when the store lived in the rank being
  /// replaced (rank 0 with the in-rank store: nothing survived to rejoin).
  bool rejoin = false;
  /// Which adapter (compat or native) serves the collectives.
  DispatchOptions dispatch;
};

/// Options of one operation.
struct CallOptions {
  /// Bounds this operation instead of `CommOptions::timeout`.
  std::optional<std::chrono::milliseconds> timeout;
};

/// Options of `Communicator::reform()`.
struct ReformOptions {
  /// How long to wait for the survivors (and replacements) to join; unset:
  /// the group's timeout.
  std::optional<std::chrono::milliseconds> timeout;
  /// Grow back instead of shrinking: wait until every seat of this group
  /// is taken, by its survivor or by a replacement process (made with
  /// `CommOptions::rejoin` and the lost rank's number), so that the new
  /// group has this group's size and rank numbering. When a seat is still
  /// empty at the timeout, `reform` fails with `timeout` naming the ranks
  /// that did not come back and forms nothing; the survivors may then call
  /// `reform()` without this option to continue as the smaller world.
  bool wait_for_replacements = false;
};

/// An asynchronous operation in flight.
class KEEL_API Work {
 public:
  /// An empty handle; `wait()` on it is `invalid_argument`.
  Work() = default;
  /// Waits until the operation completes, fails, times out or is aborted.
  /// `timeout` bounds this wait (default: the operation's timeout). A wait
  /// that times out aborts the communicator: the operation may still be
  /// running on some ranks. Poll with `is_completed()` instead.
  /// Waiting again returns the same outcome.
  result<void> wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  /// Whether the operation has finished (successfully or not); never blocks.
  bool is_completed() const noexcept;

 private:
  friend struct detail::Access;
  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::WorkState> state_;
};

/// A group of ranks running collectives on c10d. A shared handle.
class KEEL_API Communicator {
 public:
  /// Rendezvouses with the other ranks and builds the group. Fails with
  /// `invalid_argument` on bad options or environment, `timeout` when some
  /// rank never arrives (naming the missing ranks), `unsupported` when this
  /// build lacks the backend.
  ///
  /// SIGPIPE: gloo writes to its peers' sockets with `writev`, which raises
  /// SIGPIPE when a peer has died, and SIGPIPE's default action terminates
  /// the process. So the first `create` in a process whose SIGPIPE is at
  /// that default sets it to ignored (as the Python interpreter does at
  /// startup): a write to a dead peer then fails with EPIPE and comes back
  /// as `peer_lost`. A disposition the application chose (a handler, or
  /// ignored) is left as it is.
  static result<Communicator> create(const CommOptions& options = {});

  /// This process's rank in the group.
  int rank() const noexcept;
  /// The number of ranks in the group.
  int size() const noexcept;
  /// The rank within this machine (`LOCAL_RANK`, `SLURM_LOCALID`), or -1.
  int local_rank() const noexcept;
  /// The group's name (a split's name is `parent/name`).
  const std::string& name() const noexcept;
  /// The generation: 0 (or the restart count) at creation, +1 per reform.
  int generation() const noexcept;
  /// The group's ranks as ranks of the world it was split from.
  const std::vector<int>& world_ranks() const noexcept;
  /// Which adapter serves the collectives, and why.
  const DispatchInfo& dispatch_info() const noexcept;

  /// Combines `tensor` across ranks, in place.
  result<void> all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::sum,
                          const CallOptions& call = {});
  /// The asynchronous `all_reduce`.
  result<Work> all_reduce_async(at::Tensor& tensor, ReduceOp op = ReduceOp::sum,
                                const CallOptions& call = {});

  /// Gathers every rank's `input` into `output`, concatenated along dim 0 in
  /// rank order: `output` is `[size() * input.size(0), ...]`.
  result<void> all_gather(at::Tensor& output, const at::Tensor& input,
                          const CallOptions& call = {});
  /// The asynchronous `all_gather` into one tensor.
  result<Work> all_gather_async(at::Tensor& output, const at::Tensor& input,
                                const CallOptions& call = {});
  /// Gathers every rank's `input` into `outputs[r]`, one tensor per rank,
  /// each of `input`'s shape and dtype.
  result<void> all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                          const CallOptions& call = {});
  /// The asynchronous `all_gather` into a list.
  result<Work> all_gather_async(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                const CallOptions& call = {});

  /// Reduces `input` (`[size() * n, ...]`) across ranks and leaves rank r's
  /// slice `[r * n, (r + 1) * n)` in `output` (`[n, ...]`).
  result<void> reduce_scatter(at::Tensor& output, const at::Tensor& input,
                              ReduceOp op = ReduceOp::sum, const CallOptions& call = {});
  /// The asynchronous `reduce_scatter`.
  result<Work> reduce_scatter_async(at::Tensor& output, const at::Tensor& input,
                                    ReduceOp op = ReduceOp::sum, const CallOptions& call = {});

  /// Copies rank `root`'s `tensor` to every rank, in place.
  result<void> broadcast(at::Tensor& tensor, int root, const CallOptions& call = {});
  /// The asynchronous `broadcast`.
  result<Work> broadcast_async(at::Tensor& tensor, int root, const CallOptions& call = {});

  /// Rank r sends `input`'s r-th slice along dim 0 to rank r and receives
  /// into `output`'s slices. With empty split lists the slices are equal
  /// (dim 0 divisible by `size()`); otherwise `output_splits[r]` rows come
  /// from rank r and `input_splits[r]` rows go to rank r.
  result<void> all_to_all(at::Tensor& output, const at::Tensor& input,
                          const std::vector<std::int64_t>& output_splits = {},
                          const std::vector<std::int64_t>& input_splits = {},
                          const CallOptions& call = {});
  /// The asynchronous `all_to_all`.
  result<Work> all_to_all_async(at::Tensor& output, const at::Tensor& input,
                                const std::vector<std::int64_t>& output_splits = {},
                                const std::vector<std::int64_t>& input_splits = {},
                                const CallOptions& call = {});

  /// Sends `tensor` to rank `peer`; `tag` matches it with the `recv`.
  result<void> send(const at::Tensor& tensor, int peer, int tag = 0, const CallOptions& call = {});
  /// The asynchronous `send`.
  result<Work> send_async(const at::Tensor& tensor, int peer, int tag = 0,
                          const CallOptions& call = {});
  /// Receives into `tensor` from rank `peer`.
  result<void> recv(at::Tensor& tensor, int peer, int tag = 0, const CallOptions& call = {});
  /// The asynchronous `recv`.
  result<Work> recv_async(at::Tensor& tensor, int peer, int tag = 0, const CallOptions& call = {});

  /// Returns when every rank has called it.
  result<void> barrier(const CallOptions& call = {});

  /// A sub-group of `ranks` (ranks of this group, distinct, in any order;
  /// the sub-group numbers them in ascending order). Called by the members
  /// only, in the same order on each; `name` tells sub-groups apart.
  result<Communicator> split(const std::vector<int>& ranks, std::string_view name) const;
  /// A second group of the same ranks with its own c10d backend, so that
  /// its operations run concurrently with this group's (for example
  /// reduce-scatter beside all-gather, as FSDP2 does in PyTorch 2.13).
  /// Called by every rank.
  result<Communicator> dedicated(std::string_view purpose) const;
  /// After a failure: the ranks that are still alive form a new group of
  /// the next generation on the same store, numbered in the order of their
  /// old ranks. Called by every survivor, on the world (not on a split).
  /// Fails with `timeout` when the survivors do not agree in time.
  ///
  /// With `ReformOptions::wait_for_replacements` the new group keeps this
  /// group's size and numbering, replacements taking the lost ranks' seats.
  ///
  /// Generations fence each other: a rank left out of the new generation
  /// (it was stopped, or cut off, for longer than the peer timeout while
  /// the others re-formed) finds, when it resumes, that its pending and
  /// later operations fail with `peer_lost` ("rank r went on to generation
  /// g without this rank") at its next heartbeat sample, and its own
  /// `reform()` fails with `timeout` ("left out of generation g"): it can
  /// never take a seat in, or send into, the newer group. The same holds
  /// when a replacement took its seat: each seat belongs to one process.
  ///
  /// @snippet examples/snippets/header_snippets.cpp comm_grow_back
  result<Communicator> reform(const ReformOptions& options = {}) const;

  /// Aborts the group: pending and later operations return
  /// `Errc::aborted`. Never throws; safe from any thread.
  void abort() noexcept;
  /// Whether the group was aborted (by `abort()` or by a failure).
  bool is_aborted() const noexcept;

  /// The flight recorder, as JSON: the last operations with their sequence
  /// number, op, bytes, dtype, peers, state and start and end times.
  std::string flight_recorder_json() const;
  /// Writes the flight recorder to `path` (default: a file in
  /// `KEEL_COMM_TRACE_DIR`) and returns the path; `io_error` on failure.
  result<std::string> dump_flight_recorder(const std::string& path = {}) const;

 private:
  explicit Communicator(std::shared_ptr<detail::GroupState> state) : state_(std::move(state)) {}
  std::shared_ptr<detail::GroupState> state_;
};

}  // namespace comm
}  // namespace v1
}  // namespace keel
