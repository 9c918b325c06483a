#include "comm/waiting.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include "diagnostics.h"
#include "environment.h"
#include "guard.h"

namespace keel {
inline namespace v1 {
namespace comm::detail {

namespace {

std::string peer_name(const GroupState& g, int world_rank) {
  const auto it = std::find(g.world_ranks.begin(), g.world_ranks.end(), world_rank);
  const int r = static_cast<int>(it - g.world_ranks.begin());
  if (g.is_world || r == world_rank) return absl::StrCat("rank ", world_rank);
  return absl::StrCat("rank ", r, " (world rank ", world_rank, ")");
}

std::string trace_dir() {
  if (auto dir = internal::environment_value("KEEL_COMM_TRACE_DIR")) return *dir;
  std::error_code ec;
  auto tmp = std::filesystem::temp_directory_path(ec);
  return ec ? std::string("/tmp") : tmp.string();
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

}  // namespace

std::string describe_lost(const GroupState& g, const std::vector<LostPeer>& lost) {
  std::vector<std::string> parts;
  parts.reserve(lost.size());
  for (const LostPeer& p : lost)
    parts.push_back(absl::StrCat(peer_name(g, p.world_rank), " ", p.why));
  return absl::StrJoin(parts, "; ");
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
    run_detached([work, p2p, budget] {
      std::exception_ptr error;
      try {
        work->wait(std::max(budget, Millis(1)));
      } catch (...) {
        error = std::current_exception();
      }
      p2p->done(error);
    });
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

}  // namespace comm::detail
}  // namespace v1
}  // namespace keel
