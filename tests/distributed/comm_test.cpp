// Distributed tests: N keel_comm_worker processes on loopback, on an
// ephemeral port, each test bounded in time (a hang fails the test and the
// workers are killed). The workers check values; this file checks exits,
// errors and timings, and prints the dead-peer detection times.
#include <gtest/gtest.h>

#include "loopback.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using keel::testing::free_port;
using keel::testing::now_ms;

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

struct Rank {
  pid_t pid = -1;
  std::string log;
  int status = -1;  // exit code, or 128 + signal
  bool done = false;
};

class World {
 public:
  // Spawns ranks [0, launch) of a world of `world` ranks.
  World(const std::string& scenario, int world, std::vector<std::string> extra, int launch = -1)
      : dir_(std::filesystem::temp_directory_path() /
             ("keel-comm-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++))) {
    std::filesystem::create_directories(dir_);
    const std::string port = std::to_string(free_port());
    if (launch < 0) launch = world;
    for (int r = 0; r < launch; ++r) {
      Rank rank;
      rank.log = (dir_ / ("rank" + std::to_string(r) + ".log")).string();
      std::vector<std::string> args{KEEL_COMM_WORKER,  scenario,  "--rank",
                                    std::to_string(r), "--world", std::to_string(world),
                                    "--port",          port};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_addopen(&actions, 1, rank.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
      posix_spawn_file_actions_adddup2(&actions, 1, 2);
      if (posix_spawn(&rank.pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
        rank.pid = -1;
      }
      posix_spawn_file_actions_destroy(&actions);
      ranks_.push_back(rank);
    }
  }

  ~World() {
    for (Rank& r : ranks_) {
      if (!r.done && r.pid > 0) {
        ::kill(r.pid, SIGKILL);
        ::waitpid(r.pid, nullptr, 0);
      }
    }
    std::error_code ec;
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir_, ec);
  }

  // Waits for every rank; false (and all killed) when `limit` passes first.
  bool wait(Millis limit) {
    const auto deadline = Clock::now() + limit;
    while (true) {
      bool all = true;
      for (Rank& r : ranks_) {
        if (r.done || r.pid <= 0) continue;
        int status = 0;
        if (::waitpid(r.pid, &status, WNOHANG) == r.pid) {
          r.done = true;
          r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        } else {
          all = false;
        }
      }
      if (all) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(Millis(20));
    }
  }

  // Waits until every launched rank printed READY (false after `limit`).
  bool ready(Millis limit) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      bool all = true;
      for (std::size_t r = 0; r < ranks_.size(); ++r) {
        if (log(static_cast<int>(r)).find("READY") == std::string::npos) all = false;
      }
      if (all) return true;
      std::this_thread::sleep_for(Millis(20));
    }
    return false;
  }

  void kill(int rank) { ::kill(ranks_[rank].pid, SIGKILL); }

  std::string log(int rank) const {
    std::ifstream in(ranks_[rank].log);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  int status(int rank) const { return ranks_[rank].status; }
  int size() const { return static_cast<int>(ranks_.size()); }

  std::string all_logs() const {
    std::string s;
    for (int r = 0; r < size(); ++r) {
      // How it ended: an exit code, or 128 + the signal that killed it.
      const std::string ended =
          ranks_[r].done ? " (status " + std::to_string(ranks_[r].status) + ")" : "";
      s += "--- rank " + std::to_string(r) + ended + "\n" + log(r);
    }
    return s;
  }

  // The number after `word` in rank's log, or -1.
  std::int64_t number_after(int rank, const std::string& word) const {
    const std::string text = log(rank);
    const auto at = text.find(word + " ");
    if (at == std::string::npos) return -1;
    return std::stoll(text.substr(at + word.size() + 1));
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::vector<Rank> ranks_;
};

std::vector<std::string> backends() {
  std::vector<std::string> b{"compat"};
  if (KEEL_TEST_EXPECT_NATIVE) b.push_back("native");
  return b;
}

void expect_all_passed(World& w, const std::string& what) {
  for (int r = 0; r < w.size(); ++r) {
    EXPECT_EQ(w.status(r), 0) << what << ": rank " << r << " failed\n" << w.all_logs();
  }
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
                            std::mt19937& rng) {
  World w("kill", n, {"--op", op, "--victim", std::to_string(victim), "--backend", backend});
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

const std::vector<std::string> kOps{"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                    "all_to_all", "send_recv",  "barrier"};

TEST(CommDistributed, KillDuringEachCollectiveThenReform) {
  std::mt19937 rng(7);
  for (const std::string& op : kOps) {
    const KillOutcome o = kill_and_reform(op, 3, /*victim=*/1, "auto", rng);
    EXPECT_FALSE(o.hang || o.wrong_result || o.other_failure) << op << "\n" << o.logs;
    EXPECT_EQ(o.detection_ms.size(), 2u) << op << "\n" << o.logs;
    for (auto t : o.detection_ms) EXPECT_LT(t, 20000 + 5000) << op;  // the timeout plus a few s
    std::printf("kill during %s: detected after %s ms\n", op.c_str(),
                o.detection_ms.empty() ? "-" : std::to_string(o.detection_ms.front()).c_str());
  }
}

// The soak: rounds of one fault each, at random: world size 2-4, victim
// (any rank but 0, which hosts the store: losing it is reported as
// peer_lost naming rank 0, but the survivors cannot re-form on it), the
// collective, the adapter and the moment. KEEL_SOAK_ROUNDS overrides the
// count (50) and KEEL_SOAK_SEED the seed (printed, so a failure replays).
TEST(CommDistributed, SoakRandomKillsNoHangNoWrongResult) {
  const char* rounds_env = std::getenv("KEEL_SOAK_ROUNDS");
  const char* seed_env = std::getenv("KEEL_SOAK_SEED");
  const int rounds = rounds_env != nullptr ? std::atoi(rounds_env) : 50;
  const auto seed = seed_env != nullptr ? static_cast<unsigned>(std::strtoul(seed_env, nullptr, 10))
                                        : std::random_device{}();
  std::printf("soak: %d rounds, seed %u (KEEL_SOAK_SEED=%u replays it)\n", rounds, seed, seed);
  std::mt19937 rng(seed);
  std::vector<std::int64_t> times;
  int hangs = 0;
  int wrong = 0;
  int other = 0;
  for (int i = 0; i < rounds; ++i) {
    const int n = std::uniform_int_distribution<int>(2, 4)(rng);
    const int victim = std::uniform_int_distribution<int>(1, n - 1)(rng);
    const std::string& op =
        kOps[std::uniform_int_distribution<std::size_t>(0, kOps.size() - 1)(rng)];
    const std::vector<std::string> adapters = backends();
    const std::string& backend =
        adapters[std::uniform_int_distribution<std::size_t>(0, adapters.size() - 1)(rng)];
    const KillOutcome o = kill_and_reform(op, n, victim, backend, rng);
    hangs += o.hang ? 1 : 0;
    wrong += o.wrong_result ? 1 : 0;
    other += o.other_failure ? 1 : 0;
    times.insert(times.end(), o.detection_ms.begin(), o.detection_ms.end());
    const bool bad = o.hang || o.wrong_result || o.other_failure;
    std::printf("soak round %d: %s on %d ranks (%s), rank %d killed: %s\n", i, op.c_str(), n,
                backend.c_str(), victim,
                o.hang ? "HANG"
                : bad  ? "FAILED"
                       : "ok");
    EXPECT_FALSE(bad) << "round " << i << " (seed " << seed << ")\n" << o.logs;
  }
  std::printf(
      "soak: %d rounds, hangs %d, wrong results %d, other failures %d, %zu detections, "
      "p50 %lld ms, p99 %lld ms\n",
      rounds, hangs, wrong, other, times.size(), static_cast<long long>(percentile(times, 0.5)),
      static_cast<long long>(percentile(times, 0.99)));
  EXPECT_EQ(hangs, 0);
  EXPECT_EQ(wrong, 0);
}

TEST(CommDistributed, RankThatExitsEarlyIsNamed) {
  World w("exit_early", 3, {"--op", "all_reduce", "--victim", "2"});
  ASSERT_TRUE(w.wait(Millis(60000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "exit_early");
  EXPECT_NE(w.log(0).find("rank 2 left"), std::string::npos) << w.all_logs();
}

TEST(CommDistributed, RankThatNeverJoinsTimesOutNamingIt) {
  World w("never_join", 3, {"--victim", "2"}, /*launch=*/2);
  ASSERT_TRUE(w.wait(Millis(30000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "never_join");
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
