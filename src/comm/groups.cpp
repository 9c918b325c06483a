// Making groups: create() (options, rendezvous, a rejoining replacement's
// seat), split() and dedicated(), and reform() after a loss. A generation
// of a world has one seat per rank, claimed by a process token, and one
// members list, the first proposal written (docs/hardening.md).
#include <algorithm>
#include <csignal>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/state.h"
#include "comm/validation.h"
#include "comm/waiting.h"
#include "diagnostics.h"
#include "dispatch/comm.h"
#include "dispatcher.h"
#include "environment.h"
#include "guard.h"
#include "keel/v1/comm.h"
#include "string_view_bridge.h"

namespace keel {
inline namespace v1 {
namespace comm {

using detail::aborted_error;
using detail::Clock;
using detail::FlightRecorder;
using detail::GroupState;
using detail::invalid;
using detail::Liveness;
using detail::LostPeer;
using detail::Millis;
using detail::RendezvousPlan;
using detail::validate_options;
using detail::WorldState;
using internal::to_absl;
using internal::comm_detail::list_ranks;

namespace {

constexpr const char* kCreate = "keel::comm::Communicator::create";

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
  auto store = internal::comm_detail::open_store(w->plan, options.timeout, deadline, *w->kernel);
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

}  // namespace comm
}  // namespace v1
}  // namespace keel
