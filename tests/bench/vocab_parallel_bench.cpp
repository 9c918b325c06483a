// The vocabulary-parallel loss against the unsharded one: each of `world`
// ranks (processes on loopback) holds [V / world, D] of the output
// embedding and runs keel::linear_cross_entropy with options.vocab_parallel;
// in the same rounds each rank also runs the unsharded loss on the whole
// [V, D] weight, alone (what one rank would do without tensor parallelism).
// Built, not run by ctest:
//   build/torch-2.15.0/tests/keel_vocab_parallel_bench [--world=2] [--rounds=5]
//                                                    [--size=ci|small]
//
// It spawns the ranks itself. Each rank runs ATen on cores / world threads.
// Every round runs both contenders once on every rank, in an order rotated
// from round to round, behind a barrier each. Printed per rank: the median
// forward+backward time of each, their ratio (median of per-round ratios),
// and the peak c10 memory of one step each (peak_tracker.h): the sharded
// step holds its weight shard's gradient and the [N, D] hidden gradient,
// and a block of V / world classes.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <keel/keel.h>

#include "../distributed/loopback.h"
#include "peak_tracker.h"
#include "process.h"

namespace {

using keel::bench::PeakTracker;
using Clock = std::chrono::steady_clock;

struct Args {
  int world = 2;
  int rank = -1;  // -1: the launcher
  int port = 0;
  int rounds = 5;
  std::string size = "ci";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](const char* key) -> const char* {
      const std::string k = std::string("--") + key + "=";
      return arg.rfind(k, 0) == 0 ? argv[i] + k.size() : nullptr;
    };
    if (const char* v = value("world")) a.world = std::atoi(v);
    if (const char* v = value("rank")) a.rank = std::atoi(v);
    if (const char* v = value("port")) a.port = std::atoi(v);
    if (const char* v = value("rounds")) a.rounds = std::atoi(v);
    if (const char* v = value("size")) a.size = v;
  }
  return a;
}

int launch(const Args& a, const char* self) {
  const std::string port = std::to_string(keel::testing::free_port());
  std::vector<pid_t> pids;
  for (int r = 0; r < a.world; ++r) {
    std::vector<std::string> args{self,
                                  "--world=" + std::to_string(a.world),
                                  "--rank=" + std::to_string(r),
                                  "--port=" + port,
                                  "--rounds=" + std::to_string(a.rounds),
                                  "--size=" + a.size};
    const keel::tooling::Spawned rank = keel::tooling::spawn(self, std::move(args));
    if (!rank) {
      std::fprintf(stderr, "keel_vocab_parallel_bench: cannot spawn rank %d\n", r);
      return 1;
    }
    pids.push_back(rank.pid);
  }
  int status = 0;
  for (pid_t pid : pids) {
    int s = 0;
    ::waitpid(pid, &s, 0);
    if (!WIFEXITED(s) || WEXITSTATUS(s) != 0) status = 1;
  }
  return status;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run_rank(const Args& a) {
  const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(std::max(1U, cores / static_cast<unsigned>(a.world))));
  keel::comm::CommOptions co;
  co.rendezvous = "tcp://127.0.0.1:" + std::to_string(a.port);
  co.rank = a.rank;
  co.world_size = a.world;
  co.timeout = std::chrono::minutes(10);
  auto made = keel::comm::Communicator::create(co);
  if (!made) {
    std::fprintf(stderr, "rank %d: %s\n", a.rank, made.error().to_string().c_str());
    return 1;
  }
  keel::comm::Communicator comm = made.value();

  const bool small = a.size == "small";
  const std::int64_t n = small ? 512 : 4096;
  const std::int64_t d = small ? 256 : 1024;
  const std::int64_t v = small ? 8192 : 32768;
  const std::int64_t start = v * a.rank / a.world;
  const std::int64_t classes = v * (a.rank + 1) / a.world - start;
  at::manual_seed(0);
  const at::Tensor hidden = at::randn({n, d}).requires_grad_(true);
  const at::Tensor weight = (at::randn({v, d}) * 0.05).requires_grad_(true);
  const at::Tensor shard = weight.detach().narrow(0, start, classes).clone().requires_grad_(true);
  const at::Tensor target = at::randint(0, v, {n}, at::kLong);

  keel::LinearCrossEntropyOptions sharded;
  sharded.vocab_parallel.communicator = comm;
  sharded.vocab_parallel.vocab_start = start;
  const keel::LinearCrossEntropyOptions whole;

  struct Contender {
    const char* name;
    std::function<void()> step;
    std::vector<double> ms;
    double peak = 0;
  };
  const auto step_of = [&](const at::Tensor& w, const keel::LinearCrossEntropyOptions& o) {
    return [&hidden, &target, w, &o] {
      auto r = keel::linear_cross_entropy(hidden, w, target, o);
      if (!r) {
        std::fprintf(stderr, "%s\n", r.error().to_string().c_str());
        std::exit(1);
      }
      r.value().loss.backward();
      hidden.mutable_grad().reset();
      w.mutable_grad().reset();
    };
  };
  std::vector<Contender> contenders{{"vocab_parallel", step_of(shard, sharded), {}, 0},
                                    {"unsharded", step_of(weight, whole), {}, 0}};
  for (Contender& c : contenders) {  // warm-up and peak memory
    auto tracker = std::make_shared<PeakTracker>();
    {
      const c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, tracker);
      c.step();
    }
    c.peak = tracker->peak();
  }
  std::vector<double> ratios;
  for (int round = 0; round < a.rounds; ++round) {
    for (std::size_t i = 0; i < contenders.size(); ++i) {
      Contender& c = contenders[(i + static_cast<std::size_t>(round)) % contenders.size()];
      if (!comm.barrier()) return 1;
      const auto t0 = Clock::now();
      c.step();
      c.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    ratios.push_back(contenders[0].ms.back() / contenders[1].ms.back());
  }

  // Rank 0 prints every rank's figures.
  const at::Tensor mine = at::tensor({median(contenders[0].ms), median(contenders[1].ms),
                                      median(ratios), contenders[0].peak, contenders[1].peak},
                                     at::kDouble);
  at::Tensor all = at::empty({a.world * mine.numel()}, at::kDouble);
  if (!comm.all_gather(all, mine)) return 1;
  if (a.rank != 0) return 0;
  std::printf(
      "N=%lld D=%lld V=%lld float32, %d ranks (V/%d = %lld classes each), %d threads "
      "per rank, %d rounds\n",
      static_cast<long long>(n), static_cast<long long>(d), static_cast<long long>(v), a.world,
      a.world, static_cast<long long>(v / a.world), at::get_num_threads(), a.rounds);
  std::printf("%-5s %14s %14s %12s %18s %18s %12s\n", "rank", "sharded ms", "unsharded ms",
              "time ratio", "sharded peak MiB", "unsharded peak MiB", "peak ratio");
  const at::Tensor table = all.view({a.world, mine.numel()});
  const auto f = table.accessor<double, 2>();
  for (int r = 0; r < a.world; ++r) {
    std::printf("%-5d %14.1f %14.1f %12.3f %18.1f %18.1f %12.3f\n", r, f[r][0], f[r][1], f[r][2],
                f[r][3] / (1 << 20), f[r][4] / (1 << 20), f[r][3] / f[r][4]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.world < 1 || a.rounds < 1) return 2;
  return a.rank < 0 ? launch(a, "/proc/self/exe") : run_rank(a);
}
