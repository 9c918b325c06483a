// A world of spawned worker processes on loopback, for the multi-process
// tests: each rank's output goes to a log file, waits are bounded, and
// ranks still running when the world goes out of scope are killed.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "loopback.h"
#include "process.h"

namespace keel::testing {

// Starts `args` (argv[0] looked up on PATH) with stdout and stderr into
// `log`; the child's pid, or -1 when it could not start.
inline pid_t spawn_logged(std::vector<std::string> args, const std::string& log) {
  tooling::SpawnOptions logged;
  logged.stdout_path = log;
  logged.stderr_to_stdout = true;
  logged.search_path = true;
  const std::string program = args.at(0);
  return tooling::spawn(program, std::move(args), logged).pid;
}

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
  // What a rank's command starts with (e.g. `ip netns exec NS`), per rank;
  // the command itself execs the worker, so that the pid is the worker's.
  using Launcher = std::function<std::vector<std::string>(int rank)>;

  // Spawns ranks [0, launch) of a world of `world` ranks.
  World(const std::string& worker, const std::string& scenario, int world,
        std::vector<std::string> extra, int launch = -1, Launcher launcher = {})
      : dir_(std::filesystem::temp_directory_path() /
             ("keel-comm-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++))),
        worker_(worker),
        scenario_(scenario),
        world_(world),
        port_(free_port()),
        extra_(std::move(extra)),
        launcher_(std::move(launcher)) {
    std::filesystem::create_directories(dir_);
    if (launch < 0) launch = world;
    for (int r = 0; r < launch; ++r) add(r);
  }

  // Spawns one more process as `rank` (a replacement, say), with `more`
  // arguments after the world's; returns its index for log(), status() and
  // the waits.
  int add(int rank, const std::vector<std::string>& more = {}) {
    Rank spawned;
    const int index = static_cast<int>(ranks_.size());
    spawned.log =
        (dir_ / ("process" + std::to_string(index) + "-rank" + std::to_string(rank) + ".log"))
            .string();
    std::vector<std::string> args;
    if (launcher_) args = launcher_(rank);
    args.insert(args.end(), {worker_, scenario_, "--rank", std::to_string(rank), "--world",
                             std::to_string(world_), "--port", std::to_string(port_)});
    args.insert(args.end(), extra_.begin(), extra_.end());
    args.insert(args.end(), more.begin(), more.end());
    spawned.pid = spawn_logged(std::move(args), spawned.log);
    ranks_.push_back(spawned);
    return index;
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

  // Waits for every rank; false when `limit` passes first (the destructor
  // kills what still runs).
  bool wait(Millis limit) { return wait_for({}, limit); }

  // Waits for the given ranks (empty: all); false when `limit` passes first.
  bool wait_for(const std::vector<int>& which, Millis limit) {
    const auto deadline = Clock::now() + limit;
    while (true) {
      bool all = true;
      for (std::size_t i = 0; i < ranks_.size(); ++i) {
        if (!which.empty() &&
            std::find(which.begin(), which.end(), static_cast<int>(i)) == which.end()) {
          continue;
        }
        Rank& r = ranks_[i];
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

  void kill(int rank) { signal(rank, SIGKILL); }
  void signal(int rank, int sig) { ::kill(ranks_[rank].pid, sig); }

  // Waits until `rank`'s log holds `text` (false after `limit`).
  bool wait_for_line(int rank, const std::string& text, Millis limit) const {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (log(rank).find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(Millis(20));
    }
    return false;
  }

  // A path in the world's own directory.
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

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
      s += "--- process " + std::to_string(r) + ended + "\n" + log(r);
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
  std::string worker_;
  std::string scenario_;
  int world_;
  int port_;
  std::vector<std::string> extra_;
  Launcher launcher_;
  std::vector<Rank> ranks_;
};

inline void expect_all_passed(World& w, const std::string& what) {
  for (int r = 0; r < w.size(); ++r) {
    EXPECT_EQ(w.status(r), 0) << what << ": rank " << r << " failed\n" << w.all_logs();
  }
}

}  // namespace keel::testing
