// The communicator's state: what a world shares with its splits
// (WorldState), one group (GroupState), and one issued operation
// (WorkState, ThreadWait). Every file of src/comm/ works on these; the
// public classes hold them through the pointers comm.h declares.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "comm/flight_recorder.h"
#include "comm/liveness.h"
#include "comm/rendezvous.h"
#include "dispatch/comm.h"
#include "keel/v1/comm.h"

namespace keel {
inline namespace v1 {
namespace comm::detail {

using internal::comm_detail::FlightEntry;
using internal::comm_detail::FlightRecorder;
using internal::comm_detail::Liveness;
using internal::comm_detail::LostPeer;
using internal::comm_detail::RendezvousPlan;
using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// What a world (a communicator made by create() or reform()) and its
// splits share: the store, the liveness of its ranks, its options.
struct WorldState {
  c10::intrusive_ptr<c10d::Store> store;
  RendezvousPlan plan;
  CommOptions options;  // `checked` already includes KEEL_COMM_CHECK
  CommBackend backend = CommBackend::gloo;
  const internal::CommKernel* kernel = nullptr;
  DispatchInfo dispatch;
  std::string base;    // "keel/<name>/r<restart>/", shared by generations
  std::string prefix;  // base + "g<generation>/"
  int generation = 0;
  int rank = 0;
  int size = 1;
  std::unique_ptr<Liveness> liveness;
};

struct WorkState;
struct ThreadWait;

struct GroupState {
  std::shared_ptr<WorldState> world;
  bool is_world = true;
  std::string name;
  std::string prefix;  // this group's keys in the store
  int rank = 0;
  int size = 1;
  std::vector<int> world_ranks;
  std::unique_ptr<internal::CommEngine> engine;
  std::unique_ptr<FlightRecorder> recorder;

  std::mutex issue_mutex;  // operations are issued in one order per group
  std::uint64_t seq = 0;
  std::map<std::string, int> splits;  // name -> how many made, under issue_mutex
  // The last Op::blocking call, under issue_mutex: its work (if the caller
  // still holds it) and its thread.
  std::weak_ptr<WorkState> last_blocking;
  std::shared_ptr<ThreadWait> last_blocking_thread;

  std::atomic<bool> aborted{false};
  std::atomic<int> pending{0};
  std::mutex cause_mutex;
  std::string cause;

  ~GroupState();

  std::string cause_text() {
    std::lock_guard<std::mutex> lock(cause_mutex);
    return cause;
  }

  // Marks the group aborted; the first cause wins. Never throws.
  void abort_with(const std::string& why) noexcept {
    try {
      {
        std::lock_guard<std::mutex> lock(cause_mutex);
        if (cause.empty()) cause = why;
      }
      if (!aborted.exchange(true) && engine) engine->abort();
    } catch (...) {  // NOLINT(bugprone-empty-catch): abort must not throw
      aborted.store(true);
    }
  }
};

// A c10d call that a thread of keel's own runs to its end, while the caller
// waits on this with liveness and abort checks. Send and recv works end a
// timed-out wait by failing, so they are waited on once, for the whole
// deadline; Gloo's reduce_scatter runs to completion inside the call itself.
struct ThreadWait {
  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;
  std::exception_ptr error;

  void done(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex);
    finished = true;
    error = std::move(e);
    cv.notify_all();
  }
};

// Runs `body` on a thread of keel's own that outlives the call starting it
// (a Gloo collective that finishes inside its call; a send/recv wait), and
// ends inside libtorch by the operation's own deadline. Such a thread must
// not be inside libtorch while the process exits: one that woke in
// c10d::Work::wait as exit() destroyed libtorch's statics crashed the
// process (SIGSEGV in c10d::RankLocal<WorkRegistry>::get, a stopped rank
// resumed after its group was re-formed without it, libtorch 2.14.1).
// So each counts while it runs, `body`'s captures included, and at exit
// keel waits for the count to reach zero, at most kExitDrain: enough for
// a thread that is running to leave, while one still blocked in Gloo until
// its deadline does not hold the exit (it stays blocked as the process
// ends). The wait is registered with std::atexit after the process's first
// detached threads (so it runs before the statics their calls construct).
inline constexpr Millis kExitDrain{2000};
void run_detached(std::function<void()> body);

struct WorkState {
  std::shared_ptr<GroupState> group;
  c10::intrusive_ptr<c10d::Work> work;  // null: nothing to move (empty tensors)
  std::uint64_t seq = 0;
  std::string op;
  std::string what;  // for messages: "all_reduce(sum) #3 on 'world'"
  std::uint64_t bytes = 0;
  Clock::time_point start;
  Clock::time_point deadline;
  bool p2p = false;
  std::shared_ptr<ThreadWait> thread;  // set when a keel thread runs the call
  std::function<void()> finish;        // on success, e.g. avg's division
  std::mutex mutex;
  std::optional<result<void>> outcome;
  std::atomic<bool> done{false};

  ~WorkState() {
    if (!done.load() && group) group->pending.fetch_sub(1);
  }
};

struct Access {
  static Work work(std::shared_ptr<WorkState> state) { return Work(std::move(state)); }
};

}  // namespace comm::detail
}  // namespace v1
}  // namespace keel
