// keel::comm against raw c10d, in one run: N ranks on loopback (default 4),
// float32 all_reduce from 4 KiB to 64 MiB, alternating keel and a raw
// c10d::ProcessGroupGloo built by hand on its own store, medians of rounds;
// then reduce-scatter on a dedicated group concurrently with all-gather on
// the world, against the two in sequence.
//
//   keel_comm_bench [--ranks N] [--rounds R]
//
// Bus bandwidth is nccl-tests' definition: S / t * 2 (n - 1) / n.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "../distributed/loopback.h"
#include "gloo_contenders.h"
#include "keel/v1/comm.h"
#include "process.h"

namespace {

using keel::testing::free_port;

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double seconds_per_op(F&& op, int iterations) {
  const auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) op();
  return std::chrono::duration<double>(Clock::now() - t0).count() / iterations;
}

int worker(int rank, int n, int port, int rounds) {
  auto made = keel::testing::keel_world(rank, n, port);
  if (!made) return 1;
  keel::comm::Communicator comm = *made;
  // The raw contender: ProcessGroupGloo as a c10d user builds it.
  auto raw = keel::testing::raw_gloo_world(rank, n, port, 2);

  if (rank == 0) {
    std::printf(
        "keel::comm vs raw c10d ProcessGroupGloo: %d ranks on loopback, float32, "
        "medians of %d rounds, contenders alternated\n\n",
        n, rounds);
    std::printf("%10s %14s %14s %12s %12s %10s\n", "bytes", "keel us/op", "raw us/op", "keel GB/s",
                "raw GB/s", "keel/raw");
  }
  const double factor = 2.0 * (n - 1) / n;
  for (std::int64_t bytes = 4 << 10; bytes <= (64 << 20); bytes *= 4) {
    at::Tensor t = at::ones({bytes / 4});
    std::vector<at::Tensor> v{t};
    const int iterations = static_cast<int>(std::max<std::int64_t>(2, (4 << 20) / bytes * 8));
    const int iters = std::min(iterations, 200);
    std::vector<double> keel_t, raw_t;
    for (int r = 0; r < rounds; ++r) {
      (void)comm.barrier();
      keel_t.push_back(seconds_per_op([&] { (void)comm.all_reduce(t); }, iters));
      raw->barrier()->wait();
      raw_t.push_back(seconds_per_op([&] { raw->allreduce(v)->wait(); }, iters));
    }
    const double k = median(keel_t);
    const double w = median(raw_t);
    if (rank == 0) {
      std::printf("%10lld %14.1f %14.1f %12.3f %12.3f %10.3f\n", static_cast<long long>(bytes),
                  k * 1e6, w * 1e6, bytes / k * factor / 1e9, bytes / w * factor / 1e9,
                  (bytes / k) / (bytes / w));
    }
  }
  if (rank == 0) {
    std::printf(
        "\n(keel/raw is bus bandwidth keel / raw; at 4 KiB, latency keel / raw is its "
        "inverse)\n");
  }

  // Concurrent reduce-scatter (dedicated group) + all-gather (world).
  auto rs_group = comm.dedicated("reduce-scatter");
  if (!rs_group) {
    std::fprintf(stderr, "rank %d: %s\n", rank, rs_group.error().to_string().c_str());
    return 1;
  }
  const std::int64_t s = 4 << 20;  // 16 MiB per rank's shard
  at::Tensor rs_in = at::ones({n * s});
  at::Tensor rs_out = at::empty({s});
  at::Tensor ag_in = at::ones({s});
  at::Tensor ag_out = at::empty({n * s});
  std::vector<double> both, serial;
  for (int r = 0; r < rounds; ++r) {
    (void)comm.barrier();
    both.push_back(seconds_per_op(
        [&] {
          auto a = rs_group.value().reduce_scatter_async(rs_out, rs_in);
          auto b = comm.all_gather_async(ag_out, ag_in);
          (void)b.value().wait();
          (void)a.value().wait();
        },
        3));
    (void)comm.barrier();
    serial.push_back(seconds_per_op(
        [&] {
          (void)rs_group.value().reduce_scatter(rs_out, rs_in);
          (void)comm.all_gather(ag_out, ag_in);
        },
        3));
  }
  if (rank == 0) {
    std::printf(
        "\nreduce_scatter (dedicated group) + all_gather (world), 16 MiB shards: "
        "concurrent %.1f ms, in sequence %.1f ms, concurrent / sequence %.3f\n",
        median(both) * 1e3, median(serial) * 1e3, median(both) / median(serial));
  }
  (void)comm.barrier();
  raw->barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 4;
  int rounds = 5;
  int rank = -1;
  int port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--ranks")
      n = v;
    else if (k == "--rounds")
      rounds = v;
    else if (k == "--rank")
      rank = v;
    else if (k == "--port")
      port = v;
    else {
      std::fprintf(stderr, "usage: keel_comm_bench [--ranks N] [--rounds R]\n");
      return 2;
    }
  }
  if (n < 2 || rounds < 1) {
    std::fprintf(stderr, "keel_comm_bench: --ranks >= 2 and --rounds >= 1\n");
    return 2;
  }
  if (rank >= 0) return worker(rank, n, port, rounds);

  // The launcher: N copies of this binary, bounded in time.
  port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> args{"/proc/self/exe",       "--ranks", std::to_string(n), "--rounds",
                                  std::to_string(rounds), "--rank",  std::to_string(r), "--port",
                                  std::to_string(port)};
    const keel::tooling::Spawned rank = keel::tooling::spawn("/proc/self/exe", std::move(args));
    if (!rank) {
      std::fprintf(stderr, "keel_comm_bench: cannot spawn rank %d\n", r);
      return 1;
    }
    pids.push_back(rank.pid);
  }
  const auto deadline = Clock::now() + std::chrono::minutes(15);
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        for (pid_t p : pids) ::kill(p, SIGKILL);
        std::fprintf(stderr, "keel_comm_bench: ranks did not finish in 15 minutes\n");
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed == 0 ? 0 : 1;
}
