#include "comm/issue.h"

#include <mutex>

#include <absl/strings/str_cat.h>

#include "comm/validation.h"
#include "comm/waiting.h"
#include "guard.h"
#include "keel/v1/dtype.h"

namespace keel {
inline namespace v1 {
namespace comm::detail {

namespace {

result<Millis> op_timeout(const GroupState& g, const std::string& op, const CallOptions& call) {
  const Millis t = call.timeout.value_or(g.world->options.timeout);
  if (t.count() <= 0) {
    return invalid(op, absl::StrCat("timeout: expected > 0 ms, got ", t.count()));
  }
  return t;
}

}  // namespace

result<Work> issue(const std::shared_ptr<GroupState>& g, Op op, const CallOptions& call,
                   const Start& start) {
  const std::string what_base = absl::StrCat(op.name, op.detail);
  if (g->aborted.load()) return aborted_error(*g, what_base);
  auto timeout = op_timeout(*g, op.name, call);
  if (!timeout) return timeout.error();

  std::lock_guard<std::mutex> lock(g->issue_mutex);
  // c10d must see the group's operations in one order on every rank: one
  // that keel's thread is still issuing (Op::blocking) finishes first.
  if (auto previous = g->last_blocking.lock()) {
    (void)Access::work(std::move(previous)).wait();
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
    entry.dtype = keel::dtype_name(*op.tensor);
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
    run_detached([thread = w->thread, start, t = timeout.value()]() mutable {
      std::exception_ptr error;
      try {
        start(t)->wait();
      } catch (...) {
        error = std::current_exception();
      }
      thread->done(error);
    });
    g->last_blocking = w;  // the group's next operation waits for it
    g->last_blocking_thread = w->thread;
    return Access::work(std::move(w));
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
  return Access::work(std::move(w));
}

result<void> run_sync(result<Work> work) {
  if (!work) return work.error();
  return work.value().wait();
}

}  // namespace comm::detail
}  // namespace v1
}  // namespace keel
