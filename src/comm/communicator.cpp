// keel::comm::Communicator: validation, rendezvous, bounded waits, liveness,
// checked mode, the flight recorder, split and reform. The adapters
// (adapters/*/comm.cpp) only issue c10d collectives.
#include "keel/v1/comm.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <c10/util/Exception.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/flight_recorder.h"
#include "comm/liveness.h"
#include "comm/rendezvous.h"
#include "diagnostics.h"
#include "dispatch/comm.h"
#include "dispatcher.h"
#include "dtype_name.h"
#include "environment.h"
#include "guard.h"
#include "string_view_bridge.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define KEEL_LEAK_SANITIZER 1
#endif
#elif defined(__SANITIZE_ADDRESS__)
#define KEEL_LEAK_SANITIZER 1
#endif
#ifndef KEEL_LEAK_SANITIZER
#define KEEL_LEAK_SANITIZER 0
#endif
#if KEEL_LEAK_SANITIZER
#include <sanitizer/lsan_interface.h>
#endif

namespace {

// Marks a deliberately leaked object for LeakSanitizer (a no-op without it).
void ignore_leak([[maybe_unused]] const void* object) {
#if KEEL_LEAK_SANITIZER
  __lsan_ignore_object(object);
#endif
}

}  // namespace

namespace keel {
inline namespace v1 {
namespace comm {

using internal::to_absl;
using internal::comm_detail::FlightEntry;
using internal::comm_detail::FlightRecorder;
using internal::comm_detail::list_ranks;
using internal::comm_detail::Liveness;
using internal::comm_detail::LostPeer;
using internal::comm_detail::RendezvousPlan;
using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

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

namespace detail {

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

  ~GroupState() {
    // A backend with work that never finished (a dead peer, a timeout, an
    // abort) would block its destructor on its worker threads until Gloo's
    // own timeout: keel leaves it to the process instead.
    if (aborted.load() || pending.load() > 0) {
      // Told to LeakSanitizer, so that the sanitizer build reports only
      // leaks nobody meant.
      ignore_leak(engine.get());
      (void)engine.release();  // NOLINT(bugprone-unused-return-value): leaked on purpose
      if (internal::log_enabled("comm")) {
        internal::log_line("comm", absl::StrCat(name, " rank ", rank,
                                                ": aborted group released without joining "
                                                "its backend's threads"));
      }
    }
  }

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

}  // namespace detail

namespace {

using detail::GroupState;
using detail::ThreadWait;
using detail::WorkState;
using detail::WorldState;

constexpr const char* kCreate = "keel::comm::Communicator::create";

std::string shape_text(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

Error invalid(std::string_view op, const std::string& message) {
  return {Errc::invalid_argument, absl::StrCat("keel::comm::", to_absl(op), ": ", message)};
}

std::string peer_name(const GroupState& g, int world_rank) {
  const auto it = std::find(g.world_ranks.begin(), g.world_ranks.end(), world_rank);
  const int r = static_cast<int>(it - g.world_ranks.begin());
  if (g.is_world || r == world_rank) return absl::StrCat("rank ", world_rank);
  return absl::StrCat("rank ", r, " (world rank ", world_rank, ")");
}

std::string describe_lost(const GroupState& g, const std::vector<LostPeer>& lost) {
  std::vector<std::string> parts;
  parts.reserve(lost.size());
  for (const LostPeer& p : lost)
    parts.push_back(absl::StrCat(peer_name(g, p.world_rank), " ", p.why));
  return absl::StrJoin(parts, "; ");
}

std::string trace_dir() {
  if (auto dir = internal::environment_value("KEEL_COMM_TRACE_DIR")) return *dir;
  std::error_code ec;
  auto tmp = std::filesystem::temp_directory_path(ec);
  return ec ? std::string("/tmp") : tmp.string();
}

result<std::string> write_trace(GroupState& g, const std::string& path_in) {
  std::string path = path_in;
  if (path.empty()) {
    std::string safe = g.name;
    std::replace(safe.begin(), safe.end(), '/', '.');
    path = absl::StrCat(trace_dir(), "/keel-comm-", safe, "-g", g.world->generation, "-rank",
                        g.rank, "-pid", ::getpid(), ".json");
  }
  std::ofstream out(path, std::ios::trunc);
  out << g.recorder->json(g.name, g.rank, g.size, g.world->generation) << "\n";
  out.close();
  if (!out) {
    return Error(Errc::io_error,
                 absl::StrCat("keel::comm::dump_flight_recorder: cannot write \"", path, "\""));
  }
  return path;
}

// A failure of an operation: aborts the group, dumps the flight recorder,
// logs, and returns `error` with the dump's path.
Error fail(GroupState& g, std::uint64_t seq, const char* state, const Error& error) {
  g.recorder->finish(seq, state, error.message());
  g.abort_with(error.message());
  auto path = write_trace(g, {});
  std::string message = error.message();
  if (path) absl::StrAppend(&message, " (flight recorder: ", path.value(), ")");
  if (internal::log_enabled("comm")) internal::log_line("comm", message);
  return {error.code(), std::move(message)};
}

Error aborted_error(GroupState& g, const std::string& what) {
  return {Errc::aborted, absl::StrCat("keel::comm: ", what, ": the communicator '", g.name,
                                      "' was aborted: ", g.cause_text())};
}

std::string exception_text(const std::exception_ptr& ex) {
  try {
    std::rethrow_exception(ex);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// After c10d reported a failure: which peer died, if the heartbeats tell
// within the peer timeout.
std::vector<LostPeer> find_lost(GroupState& g, Clock::time_point limit) {
  Liveness& live = *g.world->liveness;
  const auto until = std::min(limit, Clock::now() + live.peer_timeout() + 2 * live.interval());
  while (true) {
    auto lost = live.lost(g.world_ranks);
    if (!lost.empty() || Clock::now() >= until) return lost;
    std::this_thread::sleep_for(live.interval());
  }
}

// Fails operation `seq` after c10d reported `text`: peer_lost naming the
// rank when the heartbeats tell one died (waiting for them up to `limit`),
// else the code `text` suggests.
Error fail_from_c10d(GroupState& g, std::uint64_t seq, const std::string& what,
                     const std::string& text, Clock::time_point limit) {
  auto lost = find_lost(g, limit);
  if (!lost.empty()) {
    return fail(
        g, seq, "peer_lost",
        Error(Errc::peer_lost, absl::StrCat("keel::comm: ", what, ": ", describe_lost(g, lost),
                                            " (c10d: ", text, ")")));
  }
  const Errc code = g.world->kernel->classify_failure(text);
  return fail(g, seq, code == Errc::timeout ? "timed_out" : "failed",
              Error(code, absl::StrCat("keel::comm: ", what, ": ",
                                       code == Errc::peer_lost
                                           ? "a peer closed its connection (its rank is not "
                                             "known: every heartbeat is live); "
                                           : "",
                                       "c10d: ", text)));
}

void log_done(const WorkState& w, const char* state) {
  if (!internal::log_enabled("comm")) return;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - w.start).count();
  internal::log_line("comm",
                     absl::StrFormat("%s rank %d/%d: %s, %d B, %s in %.3f ms", w.group->name,
                                     w.group->rank, w.group->size, w.what, w.bytes, state, ms));
}

// One wait slice on a c10d collective: true when the work finished (well or
// not), false when the slice ran out.
bool wait_slice(c10d::Work& work, Millis slice) {
  try {
    return work.wait(slice);
  } catch (...) {
    return work.isCompleted();
  }
}

result<void> wait_work(WorkState& w, Clock::time_point deadline) {
  GroupState& g = *w.group;
  Liveness& live = *g.world->liveness;
  auto finished_ok = [&]() -> result<void> {
    if (w.finish) {
      auto post = internal::guarded(w.op, g.world->dispatch.adapter, [&] {
        w.finish();
        return true;
      });
      if (!post) return fail(g, w.seq, "failed", post.error());
    }
    g.recorder->finish(w.seq, "completed");
    log_done(w, "completed");
    return success();
  };
  std::shared_ptr<ThreadWait> p2p = w.thread;
  if (!w.work && !p2p) return finished_ok();
  if (!p2p && w.p2p) {
    p2p = std::make_shared<ThreadWait>();
    auto work = w.work;
    const auto budget = std::chrono::duration_cast<Millis>(deadline - Clock::now()) + Millis(1000);
    std::thread([work, p2p, budget] {
      std::exception_ptr error;
      try {
        work->wait(std::max(budget, Millis(1)));
      } catch (...) {
        error = std::current_exception();
      }
      p2p->done(error);
    }).detach();
  }
  // Only send and recv works can be woken early (Work::abort).
  auto stop = [&] {
    if (w.p2p && w.work) w.work->abort();
  };

  // The first slice is long enough for most operations, so that a healthy
  // collective costs one condition-variable wait, as in raw c10d.
  Millis slice = std::max(live.interval(), Millis(20));
  Clock::time_point left_seen{};  // when only peers that left were missing
  while (true) {
    if (g.aborted.load()) {
      g.recorder->finish(w.seq, "aborted", g.cause_text());
      stop();
      return aborted_error(g, w.what);
    }
    const auto now = Clock::now();
    const auto left = std::chrono::duration_cast<Millis>(deadline - now);
    const Millis step = std::max(Millis(1), std::min(slice, left));
    bool finished = false;
    std::exception_ptr error;
    if (p2p) {
      std::unique_lock<std::mutex> lock(p2p->mutex);
      finished = p2p->cv.wait_for(lock, step, [&] { return p2p->finished; });
      error = p2p->error;
    } else {
      finished = wait_slice(*w.work, step);
      if (finished) error = w.work->exception();
    }
    if (finished && !error) return finished_ok();
    if (finished) {
      const std::string text = exception_text(error);
      if (g.aborted.load()) continue;  // abort() made it fail: report that
      return fail_from_c10d(g, w.seq, w.what, text, deadline + Millis(2000));
    }
    auto lost = live.lost(g.world_ranks);
    // A peer that left cleanly finished its part of every operation it
    // issued, but what it sent may still be in flight (a slow or lossy
    // link): the operation gets one peer timeout more before the leave is
    // called a loss. A peer that left without issuing it closed its
    // connections, so the backend fails at once anyway.
    const bool only_left = !lost.empty() && std::all_of(lost.begin(), lost.end(),
                                                        [](const LostPeer& p) { return p.left; });
    if (only_left && left_seen == Clock::time_point{}) left_seen = Clock::now();
    if (only_left && Clock::now() - left_seen < live.peer_timeout() && Clock::now() < deadline) {
      lost.clear();
    }
    if (!lost.empty()) {
      stop();
      return fail(g, w.seq, "peer_lost",
                  Error(Errc::peer_lost,
                        absl::StrCat("keel::comm: ", w.what, ": ", describe_lost(g, lost))));
    }
    if (Clock::now() >= deadline) {
      stop();
      const auto waited = std::chrono::duration_cast<Millis>(Clock::now() - w.start).count();
      return fail(g, w.seq, "timed_out",
                  Error(Errc::timeout,
                        absl::StrCat("keel::comm: ", w.what, " did not complete within ", waited,
                                     " ms; every peer's heartbeat is live, so some rank has not "
                                     "issued this operation (or issued another)")));
    }
    slice = std::max(live.interval() / 2, Millis(10));
  }
}

// --- checked mode --------------------------------------------------------

struct Descriptor {
  std::string text;         // compared across ranks
  bool all_to_all = false;  // text is "dtype|trailing|in|out" to match pairwise
};

std::string splits_text(const std::vector<std::int64_t>& s) {
  return absl::StrJoin(s, ",");
}

// Every rank posts its descriptor of operation `seq`; all must agree.
result<void> check_metadata(GroupState& g, std::uint64_t seq, const std::string& what,
                            const Descriptor& mine, Clock::time_point deadline) {
  c10d::Store& store = *g.world->store;
  auto key = [&](std::uint64_t s, int r) { return absl::StrCat(g.prefix, "check/", s, "/", r); };
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(g.size));
  for (int r = 0; r < g.size; ++r) keys.push_back(key(seq, r));
  auto posted = internal::guarded(what, "checked mode", [&] {
    store.set(keys[g.rank], std::vector<std::uint8_t>(mine.text.begin(), mine.text.end()));
    return true;
  });
  if (!posted) return fail(g, seq, "failed", posted.error());
  auto pause = Millis(1);
  while (true) {
    auto all = internal::guarded(what, "checked mode", [&] { return store.check(keys); });
    if (!all) return fail(g, seq, "failed", all.error());
    if (all.value()) break;
    if (g.aborted.load()) return aborted_error(g, what);
    auto lost = g.world->liveness->lost(g.world_ranks);
    if (!lost.empty()) {
      return fail(
          g, seq, "peer_lost",
          Error(Errc::peer_lost, absl::StrCat("keel::comm: ", what, ": ", describe_lost(g, lost))));
    }
    if (Clock::now() >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < g.size; ++r) {
        auto there =
            internal::guarded(what, "checked mode", [&] { return store.check({keys[r]}); });
        if (!there || !there.value()) missing.push_back(r);
      }
      return fail(
          g, seq, "timed_out",
          Error(Errc::timeout,
                absl::StrCat("keel::comm: ", what, ": rank", missing.size() == 1 ? " " : "s ",
                             list_ranks(missing), " did not issue it in time (checked mode)")));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, Millis(20));
  }
  auto values = internal::guarded(what, "checked mode", [&] { return store.multiGet(keys); });
  if (!values) return fail(g, seq, "failed", values.error());
  if (seq > 1) {  // every rank posted seq, so all have read seq - 1
    (void)internal::guarded(what, "checked mode",
                            [&] { return store.deleteKey(key(seq - 1, g.rank)); });
  }
  std::vector<std::string> texts;
  for (const auto& v : values.value()) texts.emplace_back(v.begin(), v.end());

  std::string mismatch;
  if (!mine.all_to_all) {
    std::map<std::string, std::vector<int>> by_text;
    for (int r = 0; r < g.size; ++r) by_text[texts[r]].push_back(r);
    if (by_text.size() > 1) {
      std::vector<std::string> parts;
      parts.reserve(by_text.size());
      for (const auto& [text, ranks] : by_text) {
        parts.push_back(
            absl::StrCat("rank", ranks.size() == 1 ? " " : "s ", list_ranks(ranks), ": ", text));
      }
      mismatch = absl::StrJoin(parts, "; ");
    }
  } else {
    // "dtype|trailing|in|out": dtype and trailing dims agree, and what rank
    // i sends to j is what j expects from i.
    std::vector<std::vector<std::string>> f;
    f.reserve(texts.size());
    for (const auto& t : texts) f.push_back(absl::StrSplit(t, '|'));
    auto split = [](const std::string& s) {
      std::vector<std::int64_t> v;
      for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
        std::int64_t x = 0;
        (void)absl::SimpleAtoi(p, &x);
        v.push_back(x);
      }
      return v;
    };
    for (int i = 0; i < g.size && mismatch.empty(); ++i) {
      if (f[i].size() != 4 || f[i][0] != f[0][0] || f[i][1] != f[0][1]) {
        mismatch = absl::StrCat("rank 0: ", texts[0], "; rank ", i, ": ", texts[i]);
        break;
      }
      const auto in_i = split(f[i][2]);
      for (int j = 0; j < g.size; ++j) {
        const auto out_j = split(f[j][3]);
        if (in_i.size() != static_cast<std::size_t>(g.size) ||
            out_j.size() != static_cast<std::size_t>(g.size) || in_i[j] != out_j[i]) {
          mismatch = absl::StrCat("rank ", i, " sends ",
                                  in_i.size() > static_cast<std::size_t>(j) ? in_i[j] : -1,
                                  " rows to rank ", j, ", which expects ",
                                  out_j.size() > static_cast<std::size_t>(i) ? out_j[i] : -1);
          break;
        }
      }
    }
  }
  if (mismatch.empty()) return success();
  // Every rank sees the same descriptors and returns the same error; the
  // operation is issued nowhere, so the group stays usable.
  g.recorder->finish(seq, "rejected", mismatch);
  return Error(
      Errc::invalid_argument,
      absl::StrCat("keel::comm: ", what, ": the ranks disagree (checked mode): ", mismatch));
}

// --- issuing ---------------------------------------------------------------

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

result<Millis> op_timeout(const GroupState& g, const std::string& op, const CallOptions& call) {
  const Millis t = call.timeout.value_or(g.world->options.timeout);
  if (t.count() <= 0) {
    return invalid(op, absl::StrCat("timeout: expected > 0 ms, got ", t.count()));
  }
  return t;
}

template <class Start>
result<Work> issue(const std::shared_ptr<GroupState>& g, Op op, const CallOptions& call,
                   Start&& start) {
  const std::string what_base = absl::StrCat(op.name, op.detail);
  if (g->aborted.load()) return aborted_error(*g, what_base);
  auto timeout = op_timeout(*g, op.name, call);
  if (!timeout) return timeout.error();

  std::lock_guard<std::mutex> lock(g->issue_mutex);
  // c10d must see the group's operations in one order on every rank: one
  // that keel's thread is still issuing (Op::blocking) finishes first.
  if (auto previous = g->last_blocking.lock()) {
    (void)detail::Access::work(std::move(previous)).wait();
  } else if (auto thread = g->last_blocking_thread) {
    std::unique_lock<std::mutex> wait(thread->mutex);
    if (!thread->cv.wait_for(wait, g->world->options.timeout, [&] { return thread->finished; })) {
      g->abort_with(absl::StrCat(what_base, ": the reduce_scatter before it never finished"));
    }
  }
  g->last_blocking.reset();
  g->last_blocking_thread.reset();
  if (g->aborted.load()) return aborted_error(*g, what_base);
  auto w = std::make_shared<WorkState>();
  w->group = g;
  w->seq = ++g->seq;
  w->op = absl::StrCat("keel::comm::", op.name);
  w->what = absl::StrCat(what_base, " #", w->seq, " on '", g->name, "'");
  w->bytes = op.bytes;
  w->p2p = op.p2p;
  w->start = Clock::now();
  w->deadline = w->start + timeout.value();
  w->finish = std::move(op.finish);
  g->pending.fetch_add(1);

  FlightEntry entry;
  entry.seq = w->seq;
  entry.op = what_base;
  entry.bytes = op.bytes;
  if (op.tensor != nullptr && op.tensor->defined()) {
    entry.dtype = internal::dtype_name(*op.tensor);
    entry.shape = op.tensor->sizes().vec();
  }
  entry.peers = op.peers.empty() ? g->world_ranks : op.peers;
  entry.start = std::chrono::system_clock::now();
  g->recorder->record(std::move(entry));

  if (op.check && g->world->options.checked) {
    auto checked = check_metadata(*g, w->seq, w->what, *op.check, w->deadline);
    if (!checked) {
      g->pending.fetch_sub(1);
      w->done = true;
      return checked.error();
    }
  }
  if (!op.empty && op.blocking) {
    w->thread = std::make_shared<ThreadWait>();
    std::thread([thread = w->thread, start, t = timeout.value()]() mutable {
      std::exception_ptr error;
      try {
        start(t)->wait();
      } catch (...) {
        error = std::current_exception();
      }
      thread->done(error);
    }).detach();
    g->last_blocking = w;  // the group's next operation waits for it
    g->last_blocking_thread = w->thread;
    return detail::Access::work(std::move(w));
  }
  if (!op.empty) {
    auto started = internal::guarded(w->op, g->world->dispatch.adapter,
                                     [&] { return start(timeout.value()); });
    if (!started) {
      g->pending.fetch_sub(1);
      w->done = true;
      // Gloo's send can fail as it is issued, when the peer it writes to
      // has died: name the peer as a failed wait would (found by the soak).
      if (g->world->kernel->classify_failure(started.error().message()) == Errc::peer_lost) {
        return fail_from_c10d(*g, w->seq, w->what, started.error().message(), w->deadline);
      }
      return fail(*g, w->seq, "failed", started.error());
    }
    w->work = std::move(started).value();
  }
  return detail::Access::work(std::move(w));
}

result<void> run_sync(result<Work> work) {
  if (!work) return work.error();
  return work.value().wait();
}

// Tensor checks every collective shares.
result<void> check_tensor(const GroupState& g, std::string_view op, std::string_view arg,
                          const at::Tensor& t) {
  if (!t.defined()) return invalid(op, absl::StrCat(to_absl(arg), ": undefined tensor"));
  const at::Device want = g.world->options.device;
  if (t.device().type() != want.type() ||
      (want.has_index() && t.device().index() != want.index())) {
    return invalid(op, absl::StrCat(to_absl(arg), ": expected a tensor on ", want.str(),
                                    " (the communicator's device), got ", t.device().str()));
  }
  if (!t.is_contiguous()) {
    return invalid(op, absl::StrCat(to_absl(arg), ": must be contiguous (", shape_text(t),
                                    " with strides [", absl::StrJoin(t.strides(), ", "), "])"));
  }
  if (t.is_sparse() || t.is_quantized()) {
    return invalid(op, absl::StrCat(to_absl(arg), ": must be a dense tensor"));
  }
  return success();
}

result<void> check_same_dtype(std::string_view op, const at::Tensor& output,
                              const at::Tensor& input) {
  if (output.scalar_type() != input.scalar_type()) {
    return invalid(op, absl::StrCat("output: dtype ", internal::dtype_name(output),
                                    " differs from input's ", internal::dtype_name(input)));
  }
  return success();
}

result<void> check_reduce_op(std::string_view op, ReduceOp reduce, const at::Tensor& t) {
  if (static_cast<int>(reduce) > static_cast<int>(ReduceOp::product)) {
    return invalid(op, absl::StrCat("op: not a ReduceOp (", static_cast<int>(reduce), ")"));
  }
  if (reduce == ReduceOp::avg && !at::isFloatingType(t.scalar_type())) {
    return invalid(op,
                   absl::StrCat("op: avg needs a floating dtype, got ", internal::dtype_name(t)));
  }
  return success();
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:  // sum, then divide: Gloo has no AVG
      return c10d::ReduceOp::SUM;
    case ReduceOp::min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::product:
      return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

std::uint64_t nbytes(const at::Tensor& t) {
  return static_cast<std::uint64_t>(t.nbytes());
}

Descriptor plain(const at::Tensor& t, const std::string& extra = {}) {
  return {absl::StrCat(internal::dtype_name(t), " ", shape_text(t), extra), false};
}

std::string trailing_text(const at::Tensor& t) {
  auto s = t.sizes().vec();
  if (!s.empty()) s.erase(s.begin());
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

// --- making groups ------------------------------------------------------

result<void> validate_options(const CommOptions& o) {
  auto bad = [](const std::string& m) { return invalid("Communicator::create", m); };
  if (o.timeout.count() <= 0)
    return bad(absl::StrCat("timeout: expected > 0 ms, got ", o.timeout.count()));
  if (o.heartbeat_interval.count() <= 0) {
    return bad(
        absl::StrCat("heartbeat_interval: expected > 0 ms, got ", o.heartbeat_interval.count()));
  }
  if (o.peer_timeout < 2 * o.heartbeat_interval) {
    return bad(absl::StrCat("peer_timeout: expected at least twice heartbeat_interval (",
                            2 * o.heartbeat_interval.count(), " ms), got ", o.peer_timeout.count(),
                            " ms"));
  }
  if (o.flight_recorder_entries < 1) return bad("flight_recorder_entries: expected >= 1, got 0");
  if (o.name.empty() || o.name.find('/') != std::string::npos) {
    return bad(absl::StrCat("name: expected a non-empty name without '/', got \"", o.name, "\""));
  }
  if (o.generation && *o.generation < 0) {
    return bad(absl::StrCat("generation: expected >= 0, got ", *o.generation));
  }
  const auto b = static_cast<int>(o.backend);
  if (b > static_cast<int>(CommBackend::nccl))
    return bad(absl::StrCat("backend: not a CommBackend (", b, ")"));
  if (o.backend == CommBackend::gloo && !o.device.is_cpu()) {
    return bad(
        absl::StrCat("device: backend gloo serves CPU tensors, got device ", o.device.str()));
  }
  if (o.backend == CommBackend::nccl && !o.device.is_cuda()) {
    return bad(
        absl::StrCat("device: backend nccl serves CUDA tensors, got device ", o.device.str()));
  }
  if (!o.device.is_cpu() && !o.device.is_cuda()) {
    return bad(absl::StrCat("device: expected cpu or cuda, got ", o.device.str()));
  }
  return success();
}

// Where a generation's seats and members are: `<base>g<generation>/`.
std::string generation_prefix(const WorldState& w, int generation) {
  return absl::StrCat(w.base, "g", generation, "/");
}

std::string seat_key(const std::string& prefix, int rank) {
  return absl::StrCat(prefix, "seat/", rank);
}

// Claims `rank`'s seat in the generation at `prefix` for this process
// (compareSet: the first claim wins); whether the seat is this process's.
bool claim_seat(c10d::Store& store, const std::string& prefix, int rank) {
  const std::string& token = internal::comm_detail::process_token();
  const auto held = store.compareSet(seat_key(prefix, rank), {},
                                     std::vector<std::uint8_t>(token.begin(), token.end()));
  return std::string(held.begin(), held.end()) == token;
}

// A replacement's seat: the generation it joins (the first after the
// newest formed that takes this rank in) and that generation's members.
struct Rejoined {
  int generation = 0;
  std::vector<int> members;
};

result<Rejoined> find_seat(const WorldState& w, Clock::time_point deadline) {
  const char* op = "Communicator::create";
  c10d::Store& store = *w.store;
  int newest = w.generation;
  while (true) {
    auto step = internal::guarded(op, "rendezvous", [&]() -> std::optional<Rejoined> {
      while (store.check({generation_prefix(w, newest + 1) + "members"})) ++newest;
      const std::string prefix = generation_prefix(w, newest + 1);
      if (!claim_seat(store, prefix, w.rank)) return Rejoined{newest + 1, {}};
      while (!store.check({prefix + "members"})) {
        if (Clock::now() >= deadline) return std::nullopt;
        std::this_thread::sleep_for(Millis(20));
      }
      return Rejoined{newest + 1,
                      internal::comm_detail::parse_members(store.get(prefix + "members"))};
    });
    if (!step) return step.error();
    if (!step.value()) {
      return Error(Errc::timeout,
                   absl::StrCat("keel::comm::", op, ": rank ", w.rank, " could not rejoin '",
                                w.options.name, "': no generation after ", newest,
                                " was formed with it within ", w.options.timeout.count(),
                                " ms (the survivors grow back with "
                                "ReformOptions::wait_for_replacements)"));
    }
    Rejoined seat = std::move(step.value()).value();
    if (seat.members.empty()) {
      return invalid(
          op, absl::StrCat("rejoin: rank ", w.rank, "'s seat in generation ", seat.generation,
                           " is held by another process (is rank ", w.rank,
                           " still alive, or was a second replacement started?)"));
    }
    if (std::find(seat.members.begin(), seat.members.end(), w.rank) != seat.members.end()) {
      return seat;
    }
    newest = seat.generation;  // formed without this rank: wait for the next one
  }
}

// A c10d backend and engine for `rank` of `size` on `prefix`, after every
// rank arrived by `deadline`. The backend keeps the group's own timeout:
// Gloo also bounds send and recv by it, and once every rank has arrived
// its connections form at once.
result<std::unique_ptr<internal::CommEngine>> make_engine(const WorldState& w,
                                                          const std::string& prefix, int rank,
                                                          int size, const std::string& name,
                                                          Clock::time_point deadline) {
  auto arrived = internal::comm_detail::await_arrival(
      *w.store, prefix, rank, size, deadline, absl::StrCat("group '", name, "'"),
      w.plan.kind == RendezvousPlan::Kind::tcp && !w.plan.external_store);
  if (!arrived) return arrived.error();
  return internal::guarded(kCreate, w.dispatch.adapter, [&] {
    internal::BackendRequest request;
    request.backend = w.backend;
    request.store = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat(prefix, "pg/"), w.store);
    request.rank = rank;
    request.size = size;
    request.timeout = w.options.timeout;
    request.host = internal::comm_detail::gloo_host(w.plan);
    request.device = w.options.device;
    request.group_name = name;
    return w.kernel->create(request);
  });
}

// A world (create() or reform()) of `size` ranks at `generation`, formed
// by `deadline`.
result<std::shared_ptr<GroupState>> make_world(std::shared_ptr<WorldState> w,
                                               Clock::time_point deadline) {
  w->prefix = generation_prefix(*w, w->generation);
  auto live = internal::guarded(kCreate, "rendezvous", [&] {
    c10::intrusive_ptr<c10d::Store> own = w->store;
    try {
      own = w->store->clone();  // a connection of its own for the heartbeat
    } catch (...) {             // NOLINT(bugprone-empty-catch): FileStore cannot clone; share it
    }
    return std::make_unique<Liveness>(
        own, w->prefix, generation_prefix(*w, w->generation + 1), w->generation + 1, w->rank,
        w->size, w->options.heartbeat_interval, w->options.peer_timeout,
        w->plan.kind == RendezvousPlan::Kind::tcp && !w->plan.external_store);
  });
  if (!live) return live.error();
  w->liveness = std::move(live).value();

  auto g = std::make_shared<GroupState>();
  g->world = w;
  g->name = w->options.name;
  g->prefix = w->prefix;
  g->rank = w->rank;
  g->size = w->size;
  g->world_ranks.resize(static_cast<std::size_t>(w->size));
  std::iota(g->world_ranks.begin(), g->world_ranks.end(), 0);
  g->recorder = std::make_unique<FlightRecorder>(w->options.flight_recorder_entries);
  auto engine = make_engine(*w, w->prefix, w->rank, w->size, g->name, deadline);
  if (!engine) return engine.error();
  g->engine = std::move(engine).value();
  if (internal::log_enabled("comm")) {
    internal::log_line(
        "comm", absl::StrCat(g->name, " rank ", g->rank, "/", g->size, ": formed generation ",
                             w->generation, " on ", w->plan.described, ", backend ",
                             to_absl(to_string(w->backend)), ", adapter ", w->dispatch.adapter));
  }
  return g;
}

}  // namespace

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
  result<void> r = wait_work(w, deadline);
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

// --- Communicator -------------------------------------------------------

namespace {

// gloo writes to peers with writev, not send(MSG_NOSIGNAL): once a peer is
// dead the next write raises SIGPIPE, which by default kills this process
// before gloo can report the failure (the soak saw a surviving rank vanish
// without a word). Ignored, the write fails with EPIPE and the failure
// reaches the caller as peer_lost. Only the default action is replaced: an
// application's own choice stands. Once per process.
void ignore_sigpipe_unless_handled() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
  });
}

}  // namespace

result<Communicator> Communicator::create(const CommOptions& options) {
  auto valid = validate_options(options);
  if (!valid) return valid.error();
  ignore_sigpipe_unless_handled();
  auto plan = internal::comm_detail::plan_rendezvous(options);
  if (!plan) return plan.error();

  auto w = std::make_shared<WorldState>();
  w->options = options;
  if (auto check = internal::environment_value("KEEL_COMM_CHECK")) {
    w->options.checked = w->options.checked || *check == "1";
  }
  w->backend = options.backend != CommBackend::automatic
                   ? options.backend
                   : (options.device.is_cuda() ? CommBackend::nccl : CommBackend::gloo);
  w->plan = std::move(plan).value();
  w->rank = w->plan.rank;
  w->size = w->plan.world_size;
  w->generation = options.generation.value_or(w->plan.restart_count);
  w->base = absl::StrCat("keel/", options.name, "/r", w->plan.restart_count, "/");

  auto request = internal::resolve_request(options.dispatch);
  if (!request) return request.error();
  const internal::CommCall call{w->backend};
  auto selection = internal::select(internal::Registry::builtin(), "comm", request.value(), call,
                                    &internal::Adapter::comm);
  if (!selection) return selection.error();
  w->kernel = selection.value().kernel;
  w->dispatch = std::move(selection.value().info);

  if (options.rejoin && w->plan.kind == RendezvousPlan::Kind::tcp && !w->plan.external_store &&
      w->rank == 0) {
    return invalid("Communicator::create",
                   "rejoin: rank 0 hosted the store, so nothing survived it to rejoin; host "
                   "the store outside the ranks (keel-store with ?store=external, or "
                   "torchrun's agent store)");
  }

  // One bound for reaching the store and the arrival of every rank.
  const auto deadline = Clock::now() + options.timeout;
  auto store = internal::comm_detail::open_store(w->plan, options.timeout, deadline);
  if (!store) return store.error();
  w->store = std::move(store).value();
  if (options.rejoin) {
    auto seat = find_seat(*w, deadline);
    if (!seat) return seat.error();
    const std::vector<int>& members = seat.value().members;
    w->generation = seat.value().generation;
    w->rank =
        static_cast<int>(std::find(members.begin(), members.end(), w->rank) - members.begin());
    w->size = static_cast<int>(members.size());
    w->plan.rank = w->rank;
    w->plan.world_size = w->size;
  }
  auto g = make_world(std::move(w), deadline);
  if (!g) return g.error();
  return Communicator(std::move(g).value());
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
  auto ok = check_tensor(*state_, name, "tensor", tensor);
  if (!ok) return ok.error();
  ok = check_reduce_op(name, op, tensor);
  if (!ok) return ok.error();
  Op d;
  d.name = name;
  d.detail = absl::StrCat("(", to_absl(to_string(op)), ")");
  d.tensor = &tensor;
  d.bytes = nbytes(tensor);
  d.empty = tensor.numel() == 0;
  d.check = plain(tensor, d.detail);
  if (op == ReduceOp::avg) {
    d.finish = [t = tensor, n = state_->size]() mutable { t.div_(n); };
  }
  at::Tensor t = tensor;
  return issue(state_, std::move(d), call,
               [&](Millis timeout) { return state_->engine->all_reduce(t, to_c10d(op), timeout); });
}

result<void> Communicator::all_reduce(at::Tensor& tensor, ReduceOp op, const CallOptions& call) {
  return run_sync(all_reduce_async(tensor, op, call));
}

result<Work> Communicator::all_gather_async(at::Tensor& output, const at::Tensor& input,
                                            const CallOptions& call) {
  const char* name = "all_gather";
  auto ok = check_tensor(*state_, name, "input", input);
  if (!ok) return ok.error();
  ok = check_tensor(*state_, name, "output", output);
  if (!ok) return ok.error();
  ok = check_same_dtype(name, output, input);
  if (!ok) return ok.error();
  const std::int64_t n = state_->size;
  auto expected = input.sizes().vec();
  if (expected.empty()) expected.push_back(1);
  expected[0] *= n;
  if (output.sizes().vec() != expected) {
    return invalid(name, absl::StrCat("output: expected [", absl::StrJoin(expected, ", "),
                                      "] (size() * input.size(0) rows), got ", shape_text(output)));
  }
  Op d;
  d.name = name;
  d.tensor = &input;
  d.bytes = nbytes(output);
  d.empty = input.numel() == 0;
  d.check = plain(input);
  at::Tensor out = output;
  at::Tensor in = input;
  return issue(state_, std::move(d), call,
               [&](Millis timeout) { return state_->engine->all_gather(out, in, timeout); });
}

result<void> Communicator::all_gather(at::Tensor& output, const at::Tensor& input,
                                      const CallOptions& call) {
  return run_sync(all_gather_async(output, input, call));
}

result<Work> Communicator::all_gather_async(std::vector<at::Tensor>& outputs,
                                            const at::Tensor& input, const CallOptions& call) {
  const char* name = "all_gather";
  auto ok = check_tensor(*state_, name, "input", input);
  if (!ok) return ok.error();
  if (outputs.size() != static_cast<std::size_t>(state_->size)) {
    return invalid(name, absl::StrCat("outputs: expected ", state_->size,
                                      " tensors (one per rank), got ", outputs.size()));
  }
  for (std::size_t r = 0; r < outputs.size(); ++r) {
    const std::string arg = absl::StrCat("outputs[", r, "]");
    ok = check_tensor(*state_, name, arg, outputs[r]);
    if (!ok) return ok.error();
    if (outputs[r].sizes() != input.sizes() || outputs[r].scalar_type() != input.scalar_type()) {
      return invalid(name,
                     absl::StrCat(arg, ": expected ", internal::dtype_name(input), " ",
                                  shape_text(input), " (input's), got ",
                                  internal::dtype_name(outputs[r]), " ", shape_text(outputs[r])));
    }
  }
  Op d;
  d.name = name;
  d.detail = "(list)";
  d.tensor = &input;
  d.bytes = nbytes(input) * static_cast<std::uint64_t>(state_->size);
  d.empty = input.numel() == 0;
  d.check = plain(input, d.detail);
  std::vector<at::Tensor> outs = outputs;
  at::Tensor in = input;
  return issue(state_, std::move(d), call,
               [&](Millis timeout) { return state_->engine->all_gather_list(outs, in, timeout); });
}

result<void> Communicator::all_gather(std::vector<at::Tensor>& outputs, const at::Tensor& input,
                                      const CallOptions& call) {
  return run_sync(all_gather_async(outputs, input, call));
}

result<Work> Communicator::reduce_scatter_async(at::Tensor& output, const at::Tensor& input,
                                                ReduceOp op, const CallOptions& call) {
  const char* name = "reduce_scatter";
  auto ok = check_tensor(*state_, name, "input", input);
  if (!ok) return ok.error();
  ok = check_tensor(*state_, name, "output", output);
  if (!ok) return ok.error();
  ok = check_same_dtype(name, output, input);
  if (!ok) return ok.error();
  ok = check_reduce_op(name, op, input);
  if (!ok) return ok.error();
  auto expected = output.sizes().vec();
  if (expected.empty()) expected.push_back(1);
  expected[0] *= state_->size;
  if (input.sizes().vec() != expected) {
    return invalid(name, absl::StrCat("input: expected [", absl::StrJoin(expected, ", "),
                                      "] (size() * output.size(0) rows), got ", shape_text(input)));
  }
  Op d;
  d.name = name;
  d.detail = absl::StrCat("(", to_absl(to_string(op)), ")");
  d.tensor = &input;
  d.bytes = nbytes(input);
  d.empty = input.numel() == 0;
  d.check = plain(input, d.detail);
  if (op == ReduceOp::avg) {
    d.finish = [t = output, n = state_->size]() mutable { t.div_(n); };
  }
  // Gloo's _reduce_scatter_base finishes inside the call (an allreduce it
  // waits on), so keel runs it on a thread of its own (Op::blocking).
  d.blocking = state_->world->backend == CommBackend::gloo;
  return issue(state_, std::move(d), call,
               [g = state_, out = output, in = input, op](Millis timeout) mutable {
                 return g->engine->reduce_scatter(out, in, to_c10d(op), timeout);
               });
}

result<void> Communicator::reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                          const CallOptions& call) {
  return run_sync(reduce_scatter_async(output, input, op, call));
}

result<Work> Communicator::broadcast_async(at::Tensor& tensor, int root, const CallOptions& call) {
  const char* name = "broadcast";
  auto ok = check_tensor(*state_, name, "tensor", tensor);
  if (!ok) return ok.error();
  if (root < 0 || root >= state_->size) {
    return invalid(name, absl::StrCat("root: expected in [0, ", state_->size, "), got ", root));
  }
  Op d;
  d.name = name;
  d.detail = absl::StrCat("(root ", root, ")");
  d.tensor = &tensor;
  d.bytes = nbytes(tensor);
  d.empty = tensor.numel() == 0;
  d.check = plain(tensor, d.detail);
  at::Tensor t = tensor;
  return issue(state_, std::move(d), call,
               [&](Millis timeout) { return state_->engine->broadcast(t, root, timeout); });
}

result<void> Communicator::broadcast(at::Tensor& tensor, int root, const CallOptions& call) {
  return run_sync(broadcast_async(tensor, root, call));
}

result<Work> Communicator::all_to_all_async(at::Tensor& output, const at::Tensor& input,
                                            const std::vector<std::int64_t>& output_splits,
                                            const std::vector<std::int64_t>& input_splits,
                                            const CallOptions& call) {
  const char* name = "all_to_all";
  auto ok = check_tensor(*state_, name, "input", input);
  if (!ok) return ok.error();
  ok = check_tensor(*state_, name, "output", output);
  if (!ok) return ok.error();
  ok = check_same_dtype(name, output, input);
  if (!ok) return ok.error();
  if (input.dim() == 0 || output.dim() == 0) {
    return invalid(name, "input and output: need at least one dimension (rows are split)");
  }
  const std::int64_t n = state_->size;
  Op d;
  d.name = name;
  d.tensor = &input;
  d.bytes = nbytes(input);
  if (output_splits.empty() && input_splits.empty()) {
    if (input.size(0) % n != 0) {
      return invalid(name, absl::StrCat("input: dim 0 (", input.size(0),
                                        ") must divide by size() (", n, ") for equal splits"));
    }
    if (output.sizes() != input.sizes()) {
      return invalid(name, absl::StrCat("output: expected input's shape ", shape_text(input),
                                        " for equal splits, got ", shape_text(output)));
    }
    d.empty = input.numel() == 0;
    d.check = plain(input, "(equal)");
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
    if (trailing_text(output) != trailing_text(input)) {
      return invalid(name, absl::StrCat("output: trailing dims ", trailing_text(output),
                                        " differ from input's ", trailing_text(input)));
    }
    d.detail = "(splits)";
    d.check = Descriptor{absl::StrCat(internal::dtype_name(input), "|", trailing_text(input), "|",
                                      splits_text(input_splits), "|", splits_text(output_splits)),
                         true};
  }
  at::Tensor out = output;
  at::Tensor in = input;
  return issue(state_, std::move(d), call, [&](Millis timeout) {
    return state_->engine->all_to_all(out, in, output_splits, input_splits, timeout);
  });
}

result<void> Communicator::all_to_all(at::Tensor& output, const at::Tensor& input,
                                      const std::vector<std::int64_t>& output_splits,
                                      const std::vector<std::int64_t>& input_splits,
                                      const CallOptions& call) {
  return run_sync(all_to_all_async(output, input, output_splits, input_splits, call));
}

namespace {

result<void> check_peer(const GroupState& g, std::string_view op, int peer, int tag) {
  if (peer < 0 || peer >= g.size) {
    return invalid(op, absl::StrCat("peer: expected in [0, ", g.size, "), got ", peer));
  }
  if (peer == g.rank) return invalid(op, absl::StrCat("peer: ", peer, " is this rank"));
  if (tag < 0) return invalid(op, absl::StrCat("tag: expected >= 0, got ", tag));
  return success();
}

}  // namespace

namespace {

// send and recv: the same checks and record, one direction each.
result<Work> p2p_async(const std::shared_ptr<GroupState>& g, bool sending, const at::Tensor& tensor,
                       int peer, int tag, const CallOptions& call) {
  const char* name = sending ? "send" : "recv";
  auto ok = check_tensor(*g, name, "tensor", tensor);
  if (!ok) return ok.error();
  ok = check_peer(*g, name, peer, tag);
  if (!ok) return ok.error();
  Op d;
  d.name = name;
  d.detail = absl::StrCat(sending ? "(to " : "(from ", peer, ", tag ", tag, ")");
  d.tensor = &tensor;
  d.bytes = nbytes(tensor);
  d.empty = tensor.numel() == 0;
  d.p2p = true;
  d.peers = {g->world_ranks[static_cast<std::size_t>(peer)]};
  at::Tensor t = tensor;
  return issue(g, std::move(d), call, [&](Millis /*timeout*/) {
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
  return run_sync(send_async(tensor, peer, tag, call));
}

result<Work> Communicator::recv_async(at::Tensor& tensor, int peer, int tag,
                                      const CallOptions& call) {
  return p2p_async(state_, false, tensor, peer, tag, call);
}

result<void> Communicator::recv(at::Tensor& tensor, int peer, int tag, const CallOptions& call) {
  return run_sync(recv_async(tensor, peer, tag, call));
}

result<void> Communicator::barrier(const CallOptions& call) {
  Op d;
  d.name = "barrier";
  d.check = Descriptor{"barrier", false};
  return run_sync(issue(state_, std::move(d), call,
                        [&](Millis timeout) { return state_->engine->barrier(timeout); }));
}

result<Communicator> Communicator::split(const std::vector<int>& ranks,
                                         std::string_view name) const {
  const char* op = "Communicator::split";
  GroupState& g = *state_;
  if (g.aborted.load()) return aborted_error(g, "split");
  if (name.empty() || name.find('/') != std::string_view::npos) {
    return invalid(op, absl::StrCat("name: expected a non-empty name without '/', got \"",
                                    to_absl(name), "\""));
  }
  if (ranks.empty()) return invalid(op, "ranks: empty");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= g.size) {
      return invalid(op, absl::StrCat("ranks: ", sorted[i], " is not in [0, ", g.size, ")"));
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return invalid(op, absl::StrCat("ranks: ", sorted[i], " appears twice"));
    }
  }
  const auto me = std::find(sorted.begin(), sorted.end(), g.rank);
  if (me == sorted.end()) {
    return invalid(op, absl::StrCat("ranks: this rank (", g.rank,
                                    ") is not a member; only members call split"));
  }
  int index = 0;
  {
    std::lock_guard<std::mutex> lock(g.issue_mutex);
    index = g.splits[std::string(name)]++;
  }
  auto s = std::make_shared<GroupState>();
  s->world = g.world;
  s->is_world = false;
  s->name = absl::StrCat(g.name, "/", to_absl(name));
  s->prefix = absl::StrCat(g.prefix, "split/", to_absl(name), "/", index, "/",
                           absl::StrJoin(sorted, ","), "/");
  s->rank = static_cast<int>(me - sorted.begin());
  s->size = static_cast<int>(sorted.size());
  for (int r : sorted) s->world_ranks.push_back(g.world_ranks[static_cast<std::size_t>(r)]);
  s->recorder = std::make_unique<FlightRecorder>(g.world->options.flight_recorder_entries);
  auto engine = make_engine(*g.world, s->prefix, s->rank, s->size, s->name,
                            Clock::now() + g.world->options.timeout);
  if (!engine) return engine.error();
  s->engine = std::move(engine).value();
  return Communicator(std::move(s));
}

result<Communicator> Communicator::dedicated(std::string_view purpose) const {
  std::vector<int> all(static_cast<std::size_t>(state_->size));
  std::iota(all.begin(), all.end(), 0);
  if (purpose.empty()) return invalid("Communicator::dedicated", "purpose: empty");
  return split(all, absl::StrCat("dedicated-", to_absl(purpose)));
}

result<Communicator> Communicator::reform(const ReformOptions& options) const {
  const char* op = "Communicator::reform";
  GroupState& g = *state_;
  if (!g.is_world) {
    return invalid(op, absl::StrCat("'", g.name,
                                    "' is a split: reform the world it came from, then split "
                                    "again"));
  }
  const WorldState& old = *g.world;
  const Millis timeout = options.timeout.value_or(old.options.timeout);
  if (timeout.count() <= 0) {
    return invalid(op, absl::StrCat("timeout: expected > 0 ms, got ", timeout.count()));
  }
  const int next = old.generation + 1;
  const std::string prefix = generation_prefix(old, next);
  const std::string members_key = prefix + "members";
  const auto deadline = Clock::now() + timeout;
  c10d::Store& store = *old.store;

  // Each rank claims its seat; then the members are the seats taken by
  // ranks the heartbeats call alive (or, growing back, every seat, taken by
  // its survivor or a replacement), and the first proposal written wins
  // (compareSet), so all agree.
  struct Outcome {
    bool seat_taken = false;
    std::vector<int> missing;  // growing back: seats still empty at the deadline
    std::vector<int> members;
  };
  auto joined = internal::guarded(op, "rendezvous", [&] {
    Outcome out;
    if (!claim_seat(store, prefix, g.rank)) {
      out.seat_taken = true;
      return out;
    }
    std::vector<int> members;
    while (true) {
      if (store.check({members_key})) break;  // decided already
      std::set<int> lost;
      if (!options.wait_for_replacements) {
        for (const LostPeer& p : old.liveness->lost(g.world_ranks)) lost.insert(p.world_rank);
      }
      members.clear();
      out.missing.clear();
      for (int r = 0; r < g.size; ++r) {
        if (lost.count(r) != 0) continue;
        if (store.check({seat_key(prefix, r)})) {
          members.push_back(r);
        } else {
          out.missing.push_back(r);
        }
      }
      if (out.missing.empty() || Clock::now() >= deadline) break;
      std::this_thread::sleep_for(old.liveness->interval());
    }
    if (store.check({members_key})) {
      // Decided by another survivor: growing back, only a full world will do.
      out.members = internal::comm_detail::parse_members(store.get(members_key));
      out.missing.clear();
      for (int r = 0; options.wait_for_replacements && r < g.size; ++r) {
        if (std::find(out.members.begin(), out.members.end(), r) == out.members.end()) {
          out.missing.push_back(r);
        }
      }
    } else if (!options.wait_for_replacements || out.missing.empty()) {
      const std::string proposal = absl::StrJoin(members, ",");
      out.members = internal::comm_detail::parse_members(store.compareSet(
          members_key, {}, std::vector<std::uint8_t>(proposal.begin(), proposal.end())));
      out.missing.clear();
    }
    return out;
  });
  if (!joined) return joined.error();
  const Outcome& outcome = joined.value();
  if (!outcome.missing.empty()) {
    return Error(Errc::timeout,
                 absl::StrCat("keel::comm::", op, ": generation ", next, " of '", g.name,
                              "' did not grow back within ", timeout.count(),
                              " ms: no process "
                              "took the seat",
                              outcome.missing.size() == 1 ? " of rank " : "s of ranks ",
                              list_ranks(outcome.missing),
                              "; call reform() without wait_for_replacements to continue as "
                              "the smaller world"));
  }
  const std::vector<int>& members = outcome.members;
  const auto me = std::find(members.begin(), members.end(), g.rank);
  if (outcome.seat_taken || me == members.end()) {
    return Error(
        Errc::timeout,
        absl::StrCat("keel::comm::", op, ": rank ", g.rank, " was left out of generation ", next,
                     outcome.seat_taken ? absl::StrCat(": another process (a replacement) took "
                                                       "its seat")
                                        : absl::StrCat(" (members: ", list_ranks(members),
                                                       "); it joined too late or its heartbeat "
                                                       "looked dead")));
  }
  auto w = std::make_shared<WorldState>();
  w->store = old.store;
  w->plan = old.plan;
  w->options = old.options;
  w->backend = old.backend;
  w->kernel = old.kernel;
  w->dispatch = old.dispatch;
  w->base = old.base;
  w->generation = next;
  w->rank = static_cast<int>(me - members.begin());
  w->size = static_cast<int>(members.size());
  w->plan.rank = w->rank;
  w->plan.world_size = w->size;
  // The store stays where it was: with old rank 0 (if it survived) or
  // outside the ranks.
  auto made = make_world(std::move(w), deadline);
  if (!made) return made.error();
  return Communicator(std::move(made).value());
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
  return write_trace(*state_, path);
}

}  // namespace comm
}  // namespace v1
}  // namespace keel
