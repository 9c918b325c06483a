#include "comm/rendezvous.h"

#include <algorithm>
#include <thread>

#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

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
  plan.agent_store = agent && (*agent == "True" || *agent == "true" || *agent == "1");

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
    const std::string rest = url.substr(6);
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

result<c10::intrusive_ptr<c10d::Store>> open_store(const RendezvousPlan& plan,
                                                   std::chrono::milliseconds timeout) {
  auto made = guarded(kOp, "rendezvous", [&]() -> c10::intrusive_ptr<c10d::Store> {
    if (plan.kind == RendezvousPlan::Kind::file) {
      return c10::make_intrusive<c10d::FileStore>(plan.path, plan.world_size);
    }
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(plan.port);
    opts.isServer = plan.rank == 0 && !plan.agent_store;
    opts.waitWorkers = false;  // keel's own arrival names who is missing
    opts.timeout = timeout;
    return c10::make_intrusive<c10d::TCPStore>(plan.host, opts);
  });
  if (made) {
    made.value()->setTimeout(timeout);
    return made;
  }
  const std::string& why = made.error().message();
  const bool timed_out = absl::StrContains(why, "imed out") || absl::StrContains(why, "timeout");
  const std::string where =
      plan.kind == RendezvousPlan::Kind::file ? plan.path : absl::StrCat(plan.host, ":", plan.port);
  const std::string who = plan.agent_store ? "torchrun's agent" : "rank 0";
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
                           std::chrono::milliseconds timeout, const std::string& what,
                           bool hosted_by_rank0) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> keys;
  keys.reserve(size);
  for (int r = 0; r < size; ++r) keys.push_back(absl::StrCat(prefix, "arrive/", r));
  auto step = guarded(kOp, "rendezvous", [&] {
    store.set(keys[rank], std::vector<std::uint8_t>{'1'});
    auto pause = std::chrono::milliseconds(1);
    while (!store.check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
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
  // The host lingers a moment, so that the other ranks, which started
  // waiting at about the same time, read the same verdict from the store.
  if (rank == 0 && hosted_by_rank0) {
    std::this_thread::sleep_for(std::min(timeout / 4, std::chrono::milliseconds(1000)));
  }
  return Error(
      Errc::timeout,
      absl::StrCat(kOp, ": ", what, ": rank", missing.size() == 1 ? " " : "s ", list_ranks(missing),
                   " of ", size, " did not arrive within ", timeout.count(), " ms"));
}

}  // namespace keel::internal::comm_detail
