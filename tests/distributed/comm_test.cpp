// Distributed tests: N keel_comm_worker processes on loopback, on an
// ephemeral port, each test bounded in time (a hang fails the test and the
// workers are killed). The workers check values; this file checks exits,
// errors and timings, and prints the dead-peer detection times.
#include <gtest/gtest.h>

#include "loopback.h"
#include "netlab.h"
#include "support/scoped_env.h"
#include "world.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using keel::testing::now_ms;

using keel::testing::Clock;
using keel::testing::expect_all_passed;
using keel::testing::Millis;

// A world of keel_comm_worker ranks.
struct World : keel::testing::World {
  World(const std::string& scenario, int world, std::vector<std::string> extra, int launch = -1,
        Launcher launcher = {})
      : keel::testing::World(KEEL_COMM_WORKER, scenario, world, std::move(extra), launch,
                             std::move(launcher)) {}
};

std::vector<std::string> backends() {
  std::vector<std::string> b{"compat"};
  if (KEEL_TEST_EXPECT_NATIVE) b.push_back("native");
  return b;
}

TEST(CommDistributed, EveryOperationDtypeAndSizeExact) {
  for (const std::string& backend : backends()) {
    for (int n : {2, 4}) {
      World w("ops", n, {"--backend", backend});
      ASSERT_TRUE(w.wait(Millis(240000))) << "hang (" << backend << ", " << n << " ranks)\n"
                                          << w.all_logs();
      expect_all_passed(w, backend + " " + std::to_string(n) + " ranks");
      EXPECT_NE(w.log(0).find("adapter " + backend), std::string::npos) << w.log(0);
    }
  }
}

// One fault: `victim` is SIGKILLed at a random point of a loop of `op` on
// `n` ranks. The survivors must name it (peer_lost), re-form and compute
// `op` and a sum correctly on the new world.
struct KillOutcome {
  bool hang = false;                       // some survivor did not exit in time
  bool wrong_result = false;               // a survivor printed a value mismatch
  bool other_failure = false;              // wrong error, missed detection, failed reform
  std::vector<std::int64_t> detection_ms;  // kill to error, per survivor
  std::string logs;
};

KillOutcome kill_and_reform(const std::string& op, int n, int victim, const std::string& backend,
                            std::mt19937& rng, const std::vector<std::string>& more = {}) {
  std::vector<std::string> extra{"--op",      op,     "--victim", std::to_string(victim),
                                 "--backend", backend};
  extra.insert(extra.end(), more.begin(), more.end());
  World w("kill", n, extra);
  KillOutcome out;
  if (!w.ready(Millis(60000))) {
    out.other_failure = true;
    out.logs = "ranks never became ready\n" + w.all_logs();
    return out;
  }
  std::this_thread::sleep_for(Millis(std::uniform_int_distribution<int>(50, 400)(rng)));
  const std::int64_t killed = now_ms();
  w.kill(victim);
  out.hang = !w.wait(Millis(30000));
  out.logs = w.all_logs();
  if (out.hang) return out;
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const std::string log = w.log(r);
    if (log.find("result differs from the expected values") != std::string::npos) {
      out.wrong_result = true;
    }
    const std::int64_t detected = w.number_after(r, "DETECTED");
    if (detected >= 0) out.detection_ms.push_back(std::max<std::int64_t>(0, detected - killed));
    if (w.status(r) != 0 || detected < 0 ||
        log.find("REFORMED generation 1") == std::string::npos) {
      out.other_failure = true;
    }
  }
  if (out.wrong_result) out.other_failure = false;
  return out;
}

std::int64_t percentile(std::vector<std::int64_t> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// comm_worker.cpp's CommOptions: peer_timeout 1000 ms, heartbeat_interval
// 100 ms. A dead peer is named within the peer timeout plus one interval;
// the slack is for this 2-core machine under ctest -j (the soak's p99 in CI
// is about 1.2 s, docs/hardening.md).
constexpr std::int64_t kWorkerPeerTimeoutMs = 1000;
constexpr std::int64_t kWorkerHeartbeatMs = 100;
constexpr std::int64_t kDetectionBoundMs = kWorkerPeerTimeoutMs + kWorkerHeartbeatMs + 3000;

const std::vector<std::string> kOps{"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                    "all_to_all", "send_recv",  "barrier"};

TEST(CommDistributed, KillDuringEachCollectiveThenReform) {
  std::mt19937 rng(7);
  for (const std::string& op : kOps) {
    const KillOutcome o = kill_and_reform(op, 3, /*victim=*/1, "auto", rng);
    EXPECT_FALSE(o.hang || o.wrong_result || o.other_failure) << op << "\n" << o.logs;
    EXPECT_EQ(o.detection_ms.size(), 2u) << op << "\n" << o.logs;
    // Found by the heartbeats, not by the 20 s operation timeout.
    for (auto t : o.detection_ms) EXPECT_LT(t, kDetectionBoundMs) << op << "\n" << o.logs;
    std::printf("kill during %s: detected after %s ms\n", op.c_str(),
                o.detection_ms.empty() ? "-" : std::to_string(o.detection_ms.front()).c_str());
  }
}

// A rank that stops (SIGSTOP) inside a collective keeps its sockets open:
// its peers must still name it within the heartbeat bound (peer timeout
// 1 s, not the 20 s operation timeout), re-form without it and keep
// working; when it resumes (SIGCONT) its old group has failed and it is
// fenced out of the new generation with an error, never a hang or a seat.
TEST(CommDistributed, StoppedRankIsNamedThenFencedWhenItResumes) {
  for (const std::string& backend : backends()) {
    const std::string release = (std::filesystem::temp_directory_path() /
                                 ("keel-release-" + std::to_string(::getpid()) + "-" + backend))
                                    .string();
    std::filesystem::remove(release);
    World w("stop", 3,
            {"--op", "all_reduce", "--victim", "1", "--backend", backend, "--release", release});
    ASSERT_TRUE(w.ready(Millis(60000))) << w.all_logs();
    std::this_thread::sleep_for(Millis(200));
    const std::int64_t stopped = now_ms();
    w.signal(1, SIGSTOP);
    for (int r : {0, 2}) {
      ASSERT_TRUE(w.wait_for_line(r, "REFORMED generation 1", Millis(30000)))
          << backend << ": rank " << r << " did not re-form\n"
          << w.all_logs();
      const std::int64_t detected = w.number_after(r, "DETECTED");
      EXPECT_LT(detected - stopped, 5000) << backend << ": rank " << r << "\n" << w.all_logs();
      std::printf("%s: stopped rank named by rank %d after %lld ms\n", backend.c_str(), r,
                  static_cast<long long>(detected - stopped));
    }
    const std::int64_t resumed = now_ms();
    w.signal(1, SIGCONT);
    ASSERT_TRUE(w.wait_for({1}, Millis(30000))) << backend << ": the resumed rank hangs\n"
                                                << w.all_logs();
    std::printf("%s: resumed rank saw its group fail after %lld ms, fenced after %lld ms\n",
                backend.c_str(), static_cast<long long>(w.number_after(1, "DETECTED") - resumed),
                static_cast<long long>(w.number_after(1, "FENCED") - resumed));
    EXPECT_EQ(w.status(1), 0) << w.all_logs();
    EXPECT_NE(w.log(1).find("FENCED"), std::string::npos) << w.all_logs();
    // It learns at its next heartbeat sample, not at its operation's timeout.
    EXPECT_LT(w.number_after(1, "DETECTED") - resumed, 5000) << w.all_logs();
    EXPECT_NE(w.log(1).find("went on to generation 1 without this rank"), std::string::npos)
        << w.all_logs();
    std::ofstream(release) << "done\n";
    ASSERT_TRUE(w.wait(Millis(30000))) << backend << ": hang\n" << w.all_logs();
    expect_all_passed(w, "stop (" + backend + ")");
    EXPECT_GT(w.number_after(0, "NEW GENERATION ROUNDS"), 0) << w.all_logs();
    std::filesystem::remove(release);
  }
}

// The rendezvous store in a process of its own: keel-store, as a job
// started by hand runs it, or standing in for torchrun's agent. Stopped
// (SIGTERM, then SIGKILL) when it goes out of scope.
class StoreProcess {
 public:
  // `launcher` prefixes the command (e.g. `ip netns exec NS`).
  explicit StoreProcess(std::vector<std::string> launcher = {})
      : port_(keel::testing::free_port()) {
    log_ = (std::filesystem::temp_directory_path() /
            ("keel-store-" + std::to_string(::getpid()) + ".log"))
               .string();
    std::vector<std::string> args = std::move(launcher);
    args.insert(args.end(),
                {KEEL_STORE_EXE, "--port", std::to_string(port_), "--lifetime-s", "300"});
    pid_ = keel::testing::spawn_logged(std::move(args), log_);
  }
  ~StoreProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100 && ::waitpid(pid_, nullptr, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(Millis(20));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, WNOHANG);
    std::filesystem::remove(log_);
  }
  StoreProcess(const StoreProcess&) = delete;
  StoreProcess& operator=(const StoreProcess&) = delete;

  // Whether it serves (false after `limit`).
  bool serving(Millis limit) const {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      std::ifstream in(log_);
      std::stringstream s;
      s << in.rdbuf();
      if (s.str().find("serving on port") != std::string::npos) return true;
      std::this_thread::sleep_for(Millis(20));
    }
    return false;
  }
  int port() const { return port_; }

 private:
  int port_;
  pid_t pid_ = -1;
  std::string log_;
};

// Rank 0 dies while the store lives elsewhere: the others name it, re-form
// without it and compute correctly, on each adapter. The store is
// keel-store, reached as "?store=external".
TEST(CommDistributed, RankZeroDiesWithKeelStoreAndTheOthersReform) {
  std::mt19937 rng(11);
  for (const std::string& backend : backends()) {
    StoreProcess store;  // one store per job, as torchrun's agent makes one per rendezvous
    ASSERT_TRUE(store.serving(Millis(20000)));
    const KillOutcome o =
        kill_and_reform("all_reduce", 3, /*victim=*/0, backend, rng,
                        {"--port", std::to_string(store.port()), "--external-store", "1"});
    EXPECT_FALSE(o.hang || o.wrong_result || o.other_failure) << backend << "\n" << o.logs;
    EXPECT_EQ(o.detection_ms.size(), 2u) << backend << "\n" << o.logs;
    std::printf("keel-store (%s), rank 0 killed during all_reduce: named after %s ms\n",
                backend.c_str(),
                o.detection_ms.empty() ? "-" : std::to_string(o.detection_ms.front()).c_str());
  }
}

// The same under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True
// and a plain tcp:// address, as torchrun's environment gives it), with
// keel-store hosting the store the way the agent does; rank 0 dies during
// all_gather.
TEST(CommDistributed, RankZeroDiesUnderTorchrunsAgentStoreAndTheOthersReform) {
  StoreProcess store;
  ASSERT_TRUE(store.serving(Millis(20000)));
  std::mt19937 rng(13);
  const KillOutcome o = [&] {
    const keel::testing::ScopedEnv agent_store("TORCHELASTIC_USE_AGENT_STORE", "True");
    return kill_and_reform("all_gather", 3, /*victim=*/0, "auto", rng,
                           {"--port", std::to_string(store.port())});
  }();
  EXPECT_FALSE(o.hang || o.wrong_result || o.other_failure) << o.logs;
  EXPECT_EQ(o.detection_ms.size(), 2u) << o.logs;
}

// Issue 18 item 1: a killed rank is replaced by a new process (as
// torchrun's agent or a supervisor restarts it, with CommOptions::rejoin)
// that takes its seat; the survivors' reform waits for it and the world
// grows back to its full size with the same numbering, on each adapter,
// with the store in rank 0 and in keel-store. The worker checks an
// operation and sums exactly on the grown world.
TEST(CommDistributed, KilledRanksReplacementRejoinsAndTheWorldGrowsBack) {
  for (const std::string& backend : backends()) {
    for (const bool external : {false, true}) {
      const std::string where = backend + (external ? ", keel-store" : ", store in rank 0");
      StoreProcess store;
      ASSERT_TRUE(store.serving(Millis(20000)));
      std::vector<std::string> extra{"--victim",     "1",    "--backend", backend,
                                     "--timeout-ms", "20000"};
      if (external) {
        extra.insert(extra.end(),
                     {"--port", std::to_string(store.port()), "--external-store", "1"});
      }
      World w("replace", 3, extra);
      ASSERT_TRUE(w.ready(Millis(60000))) << where << "\n" << w.all_logs();
      std::this_thread::sleep_for(Millis(200));
      const std::int64_t killed = now_ms();
      w.kill(1);
      ASSERT_TRUE(w.wait_for_line(0, "DETECTED", Millis(30000))) << where << "\n" << w.all_logs();
      const int replacement = w.add(1, {"--rejoin", "1"});
      ASSERT_TRUE(w.wait(Millis(60000))) << where << ": hang\n" << w.all_logs();
      for (int p : {0, 2, replacement}) {
        EXPECT_EQ(w.status(p), 0) << where << ": process " << p << "\n" << w.all_logs();
      }
      EXPECT_NE(w.log(0).find("REFORMED generation 1 rank 0/3"), std::string::npos) << where << "\n"
                                                                                    << w.all_logs();
      EXPECT_NE(w.log(2).find("REFORMED generation 1 rank 2/3"), std::string::npos) << where << "\n"
                                                                                    << w.all_logs();
      EXPECT_NE(w.log(replacement).find("REJOINED generation 1 rank 1/3"), std::string::npos)
          << where << "\n"
          << w.all_logs();
      std::printf("%s: rank 1 killed, named after %lld ms, world of 3 again after %lld ms\n",
                  where.c_str(), static_cast<long long>(w.number_after(0, "DETECTED") - killed),
                  static_cast<long long>(w.number_after(replacement, "GREW") - killed));
    }
  }
}

// A replacement that never comes: the survivors' reform waiting for it
// ends with timeout naming the empty seat within its bound, and a plain
// reform then forms the smaller world.
TEST(CommDistributed, ReplacementThatNeverComesIsNamedAndTheSurvivorsShrink) {
  for (const std::string& backend : backends()) {
    World w(
        "replace", 3,
        {"--victim", "1", "--backend", backend, "--timeout-ms", "2000", "--expect-missing", "1"});
    ASSERT_TRUE(w.ready(Millis(60000))) << w.all_logs();
    std::this_thread::sleep_for(Millis(200));
    w.kill(1);
    ASSERT_TRUE(w.wait(Millis(60000))) << backend << ": hang\n" << w.all_logs();
    for (int r : {0, 2}) {
      EXPECT_EQ(w.status(r), 0) << backend << ": rank " << r << "\n" << w.all_logs();
      EXPECT_NE(w.log(r).find("REFORMED generation 1 rank"), std::string::npos) << backend << "\n"
                                                                                << w.all_logs();
    }
    std::printf("%s: the missing replacement was named after %lld ms (timeout 2000 ms)\n",
                backend.c_str(), static_cast<long long>(w.number_after(0, "MISSING")));
  }
}

// Generations fence each other when the replaced process was only stopped:
// its replacement takes the seat, and when the old process resumes it finds
// its group failed and the seat taken (an error, never a hang or a seat),
// while the grown-back world keeps working.
TEST(CommDistributed, StoppedRanksReplacementTakesItsSeatAndTheResumedProcessIsFenced) {
  for (const std::string& backend : backends()) {
    StoreProcess store;
    ASSERT_TRUE(store.serving(Millis(20000)));
    const std::string release =
        (std::filesystem::temp_directory_path() /
         ("keel-release-replace-" + std::to_string(::getpid()) + "-" + backend))
            .string();
    std::filesystem::remove(release);
    World w("replace", 3,
            {"--victim", "1", "--backend", backend, "--timeout-ms", "20000", "--release", release,
             "--port", std::to_string(store.port()), "--external-store", "1"});
    ASSERT_TRUE(w.ready(Millis(60000))) << w.all_logs();
    std::this_thread::sleep_for(Millis(200));
    w.signal(1, SIGSTOP);
    ASSERT_TRUE(w.wait_for_line(0, "DETECTED", Millis(30000))) << backend << "\n" << w.all_logs();
    const int replacement = w.add(1, {"--rejoin", "1"});
    for (int p : {0, 2}) {
      ASSERT_TRUE(w.wait_for_line(p, "REFORMED generation 1 rank", Millis(30000)))
          << backend << "\n"
          << w.all_logs();
    }
    ASSERT_TRUE(w.wait_for_line(replacement, "REJOINED generation 1 rank 1/3", Millis(30000)))
        << backend << "\n"
        << w.all_logs();
    const std::int64_t resumed = now_ms();
    w.signal(1, SIGCONT);
    ASSERT_TRUE(w.wait_for({1}, Millis(30000))) << backend << ": the resumed process hangs\n"
                                                << w.all_logs();
    EXPECT_EQ(w.status(1), 0) << w.all_logs();
    EXPECT_NE(w.log(1).find("another process (a replacement) took its seat"), std::string::npos)
        << w.all_logs();
    std::printf("%s: the resumed process was fenced after %lld ms\n", backend.c_str(),
                static_cast<long long>(w.number_after(1, "FENCED") - resumed));
    std::ofstream(release) << "done\n";
    ASSERT_TRUE(w.wait(Millis(30000))) << backend << ": hang\n" << w.all_logs();
    std::filesystem::remove(release);
    for (int p : {0, 2, replacement}) {
      EXPECT_EQ(w.status(p), 0) << backend << ": process " << p << "\n" << w.all_logs();
    }
    EXPECT_GT(w.number_after(0, "NEW GENERATION ROUNDS"), 0) << w.all_logs();
  }
}

// --- the network fails (issue 18 item 4) ---------------------------------
// Ranks in network namespaces of their own, joined by veth pairs to a hub
// where keel-store listens (tests/distributed/netlab.h). Every test bounds
// its waits, and the lab (namespaces, rules) is deleted with it.

// A world of `n` ranks in `lab`, the store in the hub.
struct NetWorld {
  NetWorld(keel::testing::NetLab& lab, const std::string& scenario, int n,
           std::vector<std::string> extra)
      : store(lab.hub_launcher()) {
    if (!store.serving(Millis(20000))) return;
    extra.insert(extra.end(), {"--host", keel::testing::NetLab::store_address(), "--port",
                               std::to_string(store.port()), "--external-store", "1"});
    world.emplace(scenario, n, extra, -1, [&lab](int r) { return lab.launcher(r); });
  }
  StoreProcess store;
  std::optional<World> world;
};

#define KEEL_NEED_NETLAB()                                              \
  do {                                                                  \
    const std::string why = keel::testing::NetLab::unavailable();       \
    if (!why.empty()) GTEST_SKIP() << "no network namespaces: " << why; \
  } while (false)

// Collectives over every op stay exact when the links are slow and their
// queues delay packets by a varying amount: only the time changes.
TEST(CommNetwork, SlowQueueingLinksKeepEveryCollectiveExact) {
  KEEL_NEED_NETLAB();
  std::vector<std::int64_t> took;
  for (const bool slow : {false, true}) {
    keel::testing::NetLab lab(3);
    ASSERT_TRUE(lab.ok());
    if (slow) {
      ASSERT_TRUE(lab.slow_links(/*mbit=*/40, /*latency_ms=*/50));
    }
    NetWorld net(lab, "net_ops", 3, {});
    ASSERT_TRUE(net.world) << "keel-store did not start in the hub namespace";
    World& w = *net.world;
    ASSERT_TRUE(w.wait(Millis(120000))) << "hang\n" << w.all_logs();
    expect_all_passed(w, slow ? "slow links" : "plain links");
    EXPECT_EQ(w.number_after(0, "OPS"), 14) << w.all_logs();
    const std::string log = w.log(0);
    const auto at = log.find(" in ");
    took.push_back(at == std::string::npos ? -1 : std::stoll(log.substr(at + 4)));
  }
  std::printf("14 collectives on 3 ranks: %lld ms on plain veth links, %lld ms at 40 Mbit/s\n",
              static_cast<long long>(took[0]), static_cast<long long>(took[1]));
}

// Packet loss: every collective gives the exact result or a bounded error
// (timeout, peer_lost), never a wrong number and never a hang.
TEST(CommNetwork, PacketLossGivesExactResultsOrABoundedError) {
  KEEL_NEED_NETLAB();
  keel::testing::NetLab lab(3);
  ASSERT_TRUE(lab.ok());
  ASSERT_TRUE(lab.lossy(/*percent=*/3));
  NetWorld net(lab, "net_ops", 3, {"--op-timeout-ms", "15000", "--tolerate-errors", "1"});
  ASSERT_TRUE(net.world) << "keel-store did not start in the hub namespace";
  World& w = *net.world;
  ASSERT_TRUE(w.wait(Millis(120000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "3% loss");
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(w.log(r).find("result differs"), std::string::npos) << w.all_logs();
  }
  std::printf("3%% packet loss each way: rank 0 %s\n", w.log(0).find("OPS") != std::string::npos
                                                           ? "completed all 14 collectives"
                                                           : "ended with a bounded error");
}

// A partition cuts one rank off: the others name it within the heartbeat
// bound; when the network heals, the cut-off process takes its seat back
// and the world re-forms at full size, exact.
TEST(CommNetwork, PartitionedRankIsNamedWithinTheBoundAndTheHealedWorldReforms) {
  KEEL_NEED_NETLAB();
  for (const std::string& backend : backends()) {
    keel::testing::NetLab lab(3);
    ASSERT_TRUE(lab.ok());
    NetWorld net(lab, "partition", 3,
                 {"--victim", "2", "--backend", backend, "--op-timeout-ms", "6000", "--timeout-ms",
                  "30000"});
    ASSERT_TRUE(net.world) << "keel-store did not start in the hub namespace";
    World& w = *net.world;
    ASSERT_TRUE(w.ready(Millis(60000))) << w.all_logs();
    std::this_thread::sleep_for(Millis(200));
    const std::int64_t cut = now_ms();
    ASSERT_TRUE(lab.partition(2));
    for (int r : {0, 1}) {
      ASSERT_TRUE(w.wait_for_line(r, "DETECTED", Millis(20000))) << backend << "\n" << w.all_logs();
      EXPECT_NE(w.log(r).find("rank 2"), std::string::npos) << w.all_logs();
      const std::int64_t named = w.number_after(r, "DETECTED") - cut;
      EXPECT_LT(named, 5000) << backend << ": rank " << r << "\n" << w.all_logs();
      std::printf("%s: partitioned rank named by rank %d after %lld ms\n", backend.c_str(), r,
                  static_cast<long long>(named));
    }
    const std::int64_t healed = now_ms();
    ASSERT_TRUE(lab.heal(2));
    ASSERT_TRUE(w.wait(Millis(60000))) << backend << ": hang\n" << w.all_logs();
    expect_all_passed(w, "partition (" + backend + ")");
    for (int r = 0; r < 3; ++r) {
      EXPECT_NE(w.log(r).find("REFORMED generation 1 rank " + std::to_string(r) + "/3"),
                std::string::npos)
          << backend << "\n"
          << w.all_logs();
    }
    std::printf(
        "%s: healed, world of 3 again after %lld ms (the cut-off process came back %s)\n",
        backend.c_str(), static_cast<long long>(w.number_after(2, "GREW") - healed),
        w.log(2).find("rejoining") == std::string::npos ? "by reform" : "as its own replacement");
  }
}

TEST(CommDistributed, RankThatExitsEarlyIsNamed) {
  World w("exit_early", 3, {"--op", "all_reduce", "--victim", "2"});
  ASSERT_TRUE(w.wait(Millis(60000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "exit_early");
  EXPECT_NE(w.log(0).find("rank 2 left"), std::string::npos) << w.all_logs();
}

// Each rank that came checks that create() ended within its timeout plus
// comm.h's 1 s.
TEST(CommDistributed, RankThatNeverJoinsTimesOutNamingIt) {
  World w("never_join", 3, {"--victim", "2", "--timeout-ms", "4000"}, /*launch=*/2);
  ASSERT_TRUE(w.wait(Millis(30000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "never_join");
  for (int r : {0, 1}) {
    std::printf("rank %d of 3 never joins, timeout 4000 ms: rank %d's create took %lld ms\n", 2, r,
                static_cast<long long>(w.number_after(r, "TOOK")));
  }
}

// Nobody serves the rendezvous address: create() gives up with `timeout`
// within its timeout plus comm.h's 1 s (the worker checks the bound and
// prints what it took), c10d's own connect loop notwithstanding.
TEST(CommDistributed, NobodyAtTheAddressTimesOutWithinTheCallersBound) {
  for (int timeout_ms : {500, 4000}) {
    World w("unreachable", 2, {"--timeout-ms", std::to_string(timeout_ms)}, /*launch=*/1);
    ASSERT_TRUE(w.wait(Millis(timeout_ms + 20000))) << "hang\n" << w.all_logs();
    expect_all_passed(w, "unreachable");
    std::printf("nobody at the address, timeout %d ms: create took %lld ms\n", timeout_ms,
                static_cast<long long>(w.number_after(0, "TOOK")));
  }
}

TEST(CommDistributed, RankSkippingAnOperationGivesTimeout) {
  World w("skip", 3, {"--victim", "2"});
  ASSERT_TRUE(w.wait(Millis(30000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "skip");
}

TEST(CommDistributed, AbortFromAnotherThreadUnblocksTheWait) {
  World w("abort", 2, {});
  ASSERT_TRUE(w.wait(Millis(30000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "abort");
  // The dump on demand is JSON with the aborted operation.
  const std::string log = w.log(0);
  const auto at = log.find("TRACE ");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string path = log.substr(at + 6, log.find('\n', at) - at - 6);
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  EXPECT_NE(s.str().find("\"state\": \"aborted\""), std::string::npos) << s.str();
  EXPECT_NE(s.str().find("\"op\": \"all_reduce(sum)\""), std::string::npos) << s.str();
  std::filesystem::remove(path);
}

TEST(CommDistributed, ConcurrentReduceScatterOnDedicatedGroupAndAllGather) {
  World w("concurrent", 2, {});
  ASSERT_TRUE(w.wait(Millis(60000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "concurrent");
}

TEST(CommDistributed, CheckedModeNamesTheRankThatDisagrees) {
  World w("checked", 3, {});
  ASSERT_TRUE(w.wait(Millis(60000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "checked");
}

TEST(CommDistributed, SplitIntoEvenAndOddRanks) {
  World w("split", 4, {});
  ASSERT_TRUE(w.wait(Millis(60000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "split");
}

}  // namespace

// --- the soak (issue 18 item 6) -------------------------------------------

// The faults the soak draws from.
enum class Fault { kill, kill_and_replace, stop_and_replace, partition };

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kill:
      return "kill";
    case Fault::kill_and_replace:
      return "kill+replace";
    case Fault::stop_and_replace:
      return "stop+replace";
    case Fault::partition:
      return "partition+heal";
  }
  return "?";
}

// One soak round: `victim` suffers `fault` at a random moment of a loop of
// `op` on `n` ranks. Killed alone, the survivors shrink (the store in rank
// 0, so the victim is not 0); replaced, stopped or cut off, the world grows
// back to `n` with keel-store (any victim), the stopped process fenced.
// Every worker checks its values exactly and prints each wrong one.
struct FaultOutcome {
  bool hang = false;
  bool wrong_result = false;
  bool other_failure = false;
  bool rejoined = false;
  std::vector<std::int64_t> detection_ms;
  std::string logs;
};

FaultOutcome fault_round(Fault fault, const std::string& op, int n, int victim,
                         const std::string& backend, std::mt19937& rng) {
  if (fault == Fault::kill) {
    const KillOutcome k = kill_and_reform(op, n, victim, backend, rng);
    return {k.hang, k.wrong_result, k.other_failure, false, k.detection_ms, k.logs};
  }
  FaultOutcome out;
  std::optional<keel::testing::NetLab> lab;
  if (fault == Fault::partition) lab.emplace(n);
  StoreProcess store(lab ? lab->hub_launcher() : std::vector<std::string>{});
  if ((lab && !lab->ok()) || !store.serving(Millis(20000))) {
    out.other_failure = true;
    out.logs = "the network lab or keel-store did not start";
    return out;
  }
  std::vector<std::string> extra{"--op",
                                 op,
                                 "--victim",
                                 std::to_string(victim),
                                 "--backend",
                                 backend,
                                 "--timeout-ms",
                                 "30000",
                                 "--op-timeout-ms",
                                 lab ? "4000" : "20000",
                                 "--port",
                                 std::to_string(store.port()),
                                 "--external-store",
                                 "1"};
  if (lab) extra.insert(extra.end(), {"--host", keel::testing::NetLab::store_address()});
  World::Launcher launcher;
  if (lab) launcher = [&lab](int r) { return lab->launcher(r); };
  World w(lab ? "partition" : "replace", n, extra, -1, launcher);
  if (!w.ready(Millis(60000))) {
    out.other_failure = true;
    out.logs = "ranks never became ready\n" + w.all_logs();
    return out;
  }
  std::this_thread::sleep_for(Millis(std::uniform_int_distribution<int>(50, 400)(rng)));
  const std::int64_t struck = now_ms();
  if (fault == Fault::kill_and_replace) w.kill(victim);
  if (fault == Fault::stop_and_replace) w.signal(victim, SIGSTOP);
  if (fault == Fault::partition && !lab->partition(victim)) out.other_failure = true;
  const int witness = victim == 0 ? 1 : 0;
  const bool named = w.wait_for_line(witness, "DETECTED", Millis(30000));
  int replacement = -1;
  if (fault == Fault::partition) {
    if (!lab->heal(victim)) out.other_failure = true;
  } else if (named) {
    replacement = w.add(victim, {"--rejoin", "1"});
  }
  if (fault == Fault::stop_and_replace) {
    (void)w.wait_for_line(replacement, "GREW", Millis(30000));
    w.signal(victim, SIGCONT);
  }
  out.hang = !w.wait(Millis(60000));
  out.logs = w.all_logs();
  if (out.hang) return out;
  for (int p = 0; p < w.size(); ++p) {
    const std::string log = w.log(p);
    if (log.find("result differs from the expected values") != std::string::npos) {
      out.wrong_result = true;
    }
    if (p == victim && fault == Fault::kill_and_replace) continue;  // killed
    if (w.status(p) != 0) out.other_failure = true;
    const bool survivor = p != victim && p != replacement;
    const std::int64_t detected = w.number_after(p, "DETECTED");
    if (survivor && detected >= 0)
      out.detection_ms.push_back(std::max<std::int64_t>(0, detected - struck));
    if (survivor && detected < 0) out.other_failure = true;
  }
  const int back = fault == Fault::partition ? victim : replacement;
  out.rejoined = back >= 0 && w.log(back).find("GREW") != std::string::npos;
  if (!out.rejoined) out.other_failure = true;
  if (out.wrong_result) out.other_failure = false;
  return out;
}

// The soak: rounds of one fault each, at random: the fault (a kill that the
// survivors shrink past, a kill whose replacement rejoins, a stop whose
// replacement takes the seat while the stopped process is fenced, a
// partition that heals; partitions only where network namespaces can be
// made), world size 2-4, victim, collective, adapter and moment.
// KEEL_SOAK_ROUNDS overrides the count (40) and KEEL_SOAK_SEED the seed
// (printed, so a failure replays). Figures per fault kind at the end.
TEST(CommDistributed, SoakRandomFaultsNoHangNoWrongResult) {
  const char* rounds_env = std::getenv("KEEL_SOAK_ROUNDS");
  const char* seed_env = std::getenv("KEEL_SOAK_SEED");
  const int rounds = rounds_env != nullptr ? std::atoi(rounds_env) : 40;
  const auto seed = seed_env != nullptr ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10))
                                        : std::random_device{}();
  std::printf("soak: %d rounds, seed %u (KEEL_SOAK_SEED=%u replays it)\n", rounds, seed, seed);
  std::mt19937 rng(seed);
  std::vector<Fault> kinds{Fault::kill, Fault::kill_and_replace, Fault::stop_and_replace};
  if (keel::testing::NetLab::unavailable().empty()) kinds.push_back(Fault::partition);
  struct Tally {
    int rounds = 0, hangs = 0, wrong = 0, other = 0, rejoins = 0;
    std::vector<std::int64_t> times;
  };
  std::map<Fault, Tally> tally;
  for (int i = 0; i < rounds; ++i) {
    const Fault fault = kinds[std::uniform_int_distribution<std::size_t>(0, kinds.size() - 1)(rng)];
    const int n = std::uniform_int_distribution<int>(2, 4)(rng);
    const int victim = std::uniform_int_distribution<int>(fault == Fault::kill ? 1 : 0, n - 1)(rng);
    const std::string& op =
        kOps[std::uniform_int_distribution<std::size_t>(0, kOps.size() - 1)(rng)];
    const std::vector<std::string> adapters = backends();
    const std::string& backend =
        adapters[std::uniform_int_distribution<std::size_t>(0, adapters.size() - 1)(rng)];
    const FaultOutcome o = fault_round(fault, op, n, victim, backend, rng);
    Tally& t = tally[fault];
    ++t.rounds;
    t.hangs += o.hang ? 1 : 0;
    t.wrong += o.wrong_result ? 1 : 0;
    t.other += o.other_failure ? 1 : 0;
    t.rejoins += o.rejoined ? 1 : 0;
    t.times.insert(t.times.end(), o.detection_ms.begin(), o.detection_ms.end());
    const bool bad = o.hang || o.wrong_result || o.other_failure;
    std::printf("soak round %d: %s of rank %d during %s on %d ranks (%s): %s\n", i,
                fault_name(fault), victim, op.c_str(), n, backend.c_str(),
                o.hang ? "HANG"
                : bad  ? "FAILED"
                       : "ok");
    EXPECT_FALSE(bad) << "round " << i << " (seed " << seed << ")\n" << o.logs;
  }
  for (const auto& [fault, t] : tally) {
    std::printf(
        "soak: %-14s %3d rounds, %3zu detections, p50 %lld ms, p99 %lld ms, %d rejoins, "
        "hangs %d, wrong results %d, other failures %d\n",
        fault_name(fault), t.rounds, t.times.size(),
        static_cast<long long>(percentile(t.times, 0.5)),
        static_cast<long long>(percentile(t.times, 0.99)), t.rejoins, t.hangs, t.wrong, t.other);
    EXPECT_EQ(t.hangs, 0) << fault_name(fault);
    EXPECT_EQ(t.wrong, 0) << fault_name(fault);
  }
}
