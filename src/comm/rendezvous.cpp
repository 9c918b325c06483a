#include "comm/rendezvous.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include "environment.h"
#include "guard.h"
#include "string_view_bridge.h"

namespace keel::internal::comm_detail {
namespace {

constexpr const char* kOp = "keel::comm::Communicator::create";

Error bad(const std::string& message) {
  return {Errc::invalid_argument, absl::StrCat(kOp, ": ", message)};
}

// An integer environment variable: nullopt when unset, an error when set but
// not an integer.
result<std::optional<int>> env_int(const char* name) {
  const auto text = environment_value(name);
  if (!text) return std::optional<int>();
  int value = 0;
  if (!absl::SimpleAtoi(*text, &value)) {
    return bad(absl::StrCat(name, "=\"", *text, "\" is not an integer"));
  }
  return std::optional<int>(value);
}

result<int> parse_port(std::string_view text, std::string_view what) {
  int port = 0;
  if (!absl::SimpleAtoi(to_absl(text), &port) || port < 1 || port > 65535) {
    return bad(absl::StrCat(to_absl(what), ": port \"", to_absl(text),
                            "\" is not an integer in [1, 65535]"));
  }
  return port;
}

}  // namespace

result<RendezvousPlan> plan_rendezvous(const comm::CommOptions& options) {
  RendezvousPlan plan;
  const std::string& url = options.rendezvous;

  // Rank and world size: the options, then torchrun, then Slurm.
  auto rank = env_int("RANK");
  auto world = env_int("WORLD_SIZE");
  auto local = env_int("LOCAL_RANK");
  if (!rank) return rank.error();
  if (!world) return world.error();
  if (!local) return local.error();
  std::string source = "torchrun's environment";
  if (!rank.value() && !world.value()) {
    rank = env_int("SLURM_PROCID");
    world = env_int("SLURM_NTASKS");
    local = env_int("SLURM_LOCALID");
    if (!rank) return rank.error();
    if (!world) return world.error();
    if (!local) return local.error();
    source = "Slurm's environment";
  }
  std::optional<int> r = options.rank ? options.rank : rank.value();
  std::optional<int> n = options.world_size ? options.world_size : world.value();
  if (options.rank || options.world_size) source = "the options";
  if (!n) {
    return bad(absl::StrCat("world size: not given (CommOptions::world_size, WORLD_SIZE or ",
                            "SLURM_NTASKS)"));
  }
  if (!r) return bad("rank: not given (CommOptions::rank, RANK or SLURM_PROCID)");
  if (*n < 1) return bad(absl::StrCat("world size: expected >= 1, got ", *n));
  if (*r < 0 || *r >= *n) {
    return bad(absl::StrCat("rank: expected in [0, ", *n, "), got ", *r));
  }
  plan.rank = *r;
  plan.world_size = *n;
  plan.local_rank = local.value().value_or(-1);
  auto restart = env_int("TORCHELASTIC_RESTART_COUNT");
  if (!restart) return restart.error();
  plan.restart_count = std::max(0, restart.value().value_or(0));
  const auto agent = environment_value("TORCHELASTIC_USE_AGENT_STORE");
  if (agent && (*agent == "True" || *agent == "true" || *agent == "1")) {
    plan.external_store = true;
    plan.store_owner = "torchrun's agent";
  }

  if (url == "env://") {
    const auto addr = environment_value("MASTER_ADDR");
    if (!addr) {
      return bad(
          "rendezvous env://: MASTER_ADDR is not set (under Slurm: export "
          "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1))");
    }
    plan.host = *addr;
    const auto port_text = environment_value("MASTER_PORT");
    auto port = parse_port(port_text.value_or("29500"), "MASTER_PORT");
    if (!port) return port.error();
    plan.port = port.value();
    plan.described =
        absl::StrCat("env:// (", plan.host, ":", plan.port, ", ranks from ", source, ")");
    return plan;
  }
  if (absl::StartsWith(url, "tcp://")) {
    std::string rest = url.substr(6);
    // The one query keel knows: ?store=external (no rank hosts the store).
    if (const auto query = rest.find('?'); query != std::string::npos) {
      if (rest.substr(query + 1) != "store=external") {
        return bad(absl::StrCat("rendezvous \"", url,
                                "\": the only query keel knows is ?store=external (the store is "
                                "hosted outside the ranks, e.g. by keel-store)"));
      }
      rest.resize(query);
      if (!plan.external_store) {
        plan.external_store = true;
        plan.store_owner = "an external store process";
      }
    }
    const auto colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return bad(absl::StrCat("rendezvous \"", url, "\": expected tcp://host:port"));
    }
    plan.host = rest.substr(0, colon);
    if (plan.host.size() > 2 && plan.host.front() == '[' && plan.host.back() == ']') {
      plan.host = plan.host.substr(1, plan.host.size() - 2);
    }
    auto port = parse_port(rest.substr(colon + 1), absl::StrCat("rendezvous \"", url, "\""));
    if (!port) return port.error();
    plan.port = port.value();
    plan.described = absl::StrCat(url, " (ranks from ", source, ")");
    return plan;
  }
  if (absl::StartsWith(url, "file://")) {
    plan.kind = RendezvousPlan::Kind::file;
    plan.path = url.substr(7);
    if (plan.path.empty()) {
      return bad(absl::StrCat("rendezvous \"", url, "\": expected file://path"));
    }
    plan.described = absl::StrCat(url, " (ranks from ", source, ")");
    return plan;
  }
  return bad(
      absl::StrCat("rendezvous \"", url, "\": expected env://, tcp://host:port or file://path"));
}

namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

Millis left_until(Clock::time_point deadline) {
  return std::max(Millis(0), std::chrono::duration_cast<Millis>(deadline - Clock::now()));
}

// Whether something accepts TCP connections at host:port before
// `deadline`, tried every 50 ms. A name that does not resolve counts as
// reachable: c10d then reports it, at once.
bool accepts_by(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string service = std::to_string(port);
  while (true) {
    addrinfo* found = nullptr;
    const int resolved = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
    if (resolved != 0 && resolved != EAI_AGAIN) return true;
    bool ok = false;
    for (addrinfo* a = found; a != nullptr && !ok; a = a->ai_next) {
      const int fd =
          ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        ok = true;
      } else if (errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const auto wait =
            static_cast<int>(std::min<std::int64_t>(left_until(deadline).count(), 200));
        if (::poll(&p, 1, wait) == 1) {
          int error = 0;
          socklen_t length = sizeof(error);
          ok = ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
        }
      }
      ::close(fd);
    }
    if (found != nullptr) ::freeaddrinfo(found);
    if (ok) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::min(Millis(50), left_until(deadline)));
  }
}

}  // namespace

result<c10::intrusive_ptr<c10d::Store>> open_store(const RendezvousPlan& plan,
                                                   std::chrono::milliseconds timeout,
                                                   Clock::time_point deadline,
                                                   const internal::CommKernel& kernel) {
  const bool connects =
      plan.kind == RendezvousPlan::Kind::tcp && (plan.rank != 0 || plan.external_store);
  if (connects && !accepts_by(plan.host, plan.port, deadline)) {
    const std::string& who = plan.store_owner;
    return Error(Errc::timeout,
                 absl::StrCat(kOp, ": rank ", plan.rank, " could not reach the store at ",
                              plan.host, ":", plan.port, " (hosted by ", who, ") within ",
                              timeout.count(), " ms: nothing accepted connections there"));
  }
  internal::StoreRequest request;
  if (plan.kind == RendezvousPlan::Kind::file) {
    request.path = plan.path;
  } else {
    request.host = plan.host;
    request.port = plan.port;
    request.serve = plan.rank == 0 && !plan.external_store;
  }
  request.world_size = plan.world_size;
  request.connect_timeout = std::max(Millis(1), left_until(deadline));
  auto made = guarded(kOp, "rendezvous", [&] { return kernel.open_store(request); });
  if (made) {
    made.value()->setTimeout(timeout);
    return made;
  }
  const std::string& why = made.error().message();
  const bool timed_out = kernel.classify_failure(why) == Errc::timeout;
  const std::string where =
      plan.kind == RendezvousPlan::Kind::file ? plan.path : absl::StrCat(plan.host, ":", plan.port);
  const std::string& who = plan.store_owner;
  if (timed_out) {
    return Error(Errc::timeout,
                 absl::StrCat(kOp, ": rank ", plan.rank, " could not reach the store at ", where,
                              " (hosted by ", who, ") within ", timeout.count(), " ms: ", why));
  }
  return Error(Errc::io_error, absl::StrCat(kOp, ": rank ", plan.rank,
                                            " could not open the store at ", where, ": ", why));
}

std::string gloo_host(const RendezvousPlan& plan) {
  if (plan.kind == RendezvousPlan::Kind::tcp &&
      (plan.host == "localhost" || absl::StartsWith(plan.host, "127.") || plan.host == "::1")) {
    return "127.0.0.1";
  }
  return {};
}

std::string list_ranks(const std::vector<int>& ranks) {
  constexpr std::size_t kShown = 16;
  if (ranks.size() <= kShown) return absl::StrJoin(ranks, ", ");
  std::vector<int> head(ranks.begin(), ranks.begin() + kShown);
  return absl::StrCat(absl::StrJoin(head, ", "), " and ", ranks.size() - kShown, " more");
}

result<void> await_arrival(c10d::Store& store, const std::string& prefix, int rank, int size,
                           Clock::time_point deadline, const std::string& what,
                           bool hosted_by_rank0) {
  const auto start = Clock::now();
  std::vector<std::string> keys;
  keys.reserve(size);
  for (int r = 0; r < size; ++r) keys.push_back(absl::StrCat(prefix, "arrive/", r));
  auto step = guarded(kOp, "rendezvous", [&] {
    store.set(keys[rank], std::vector<std::uint8_t>{'1'});
    auto pause = Millis(1);
    while (!store.check(keys)) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::min(pause, left_until(deadline)));
      pause = std::min(pause * 2, Millis(50));
    }
    return true;
  });
  if (!step) {
    if (rank == 0 || !hosted_by_rank0) return step.error();
    return Error(Errc::peer_lost, absl::StrCat(kOp, ": ", what,
                                               ": rank 0, which hosts the store, went away while "
                                               "rank ",
                                               rank, " waited for the others to arrive (",
                                               step.error().message(), ")"));
  }
  if (step.value()) return success();
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    auto there = guarded(kOp, "rendezvous", [&] { return store.check({keys[r]}); });
    if (!there || !there.value()) missing.push_back(r);
  }
  // The host stays until every rank that arrived has read the verdict
  // (they started waiting at about the same time), at most 1 s, so that
  // none of them finds the store gone instead.
  auto seen_key = [&](int r) { return absl::StrCat(prefix, "verdict-read/", r); };
  if (rank != 0 || !hosted_by_rank0) {
    (void)guarded(kOp, "rendezvous", [&] {
      store.set(seen_key(rank), std::vector<std::uint8_t>{'1'});
      return true;
    });
  } else {
    std::vector<std::string> readers;
    for (int r = 1; r < size; ++r) {
      if (std::find(missing.begin(), missing.end(), r) == missing.end()) {
        readers.push_back(seen_key(r));
      }
    }
    const auto linger = Clock::now() + Millis(1000);
    while (!readers.empty() && Clock::now() < linger) {
      auto read = guarded(kOp, "rendezvous", [&] { return store.check(readers); });
      if (!read || read.value()) break;
      std::this_thread::sleep_for(Millis(5));
    }
  }
  const auto waited = std::chrono::duration_cast<Millis>(Clock::now() - start).count();
  return Error(Errc::timeout, absl::StrCat(kOp, ": ", what, ": rank",
                                           missing.size() == 1 ? " " : "s ", list_ranks(missing),
                                           " of ", size, " did not arrive within ", waited, " ms"));
}

}  // namespace keel::internal::comm_detail
