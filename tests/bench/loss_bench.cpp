// keel::linear_cross_entropy against the naive at::linear +
// at::cross_entropy_loss, on CPU in float32: forward+backward time, forward
// time under no_grad, the three GEMMs of the same shapes alone, and the peak
// memory of one forward+backward. Built, not run by ctest:
//   build/torch-2.15.0/tests/keel_loss_bench [--size=ci|large|small] [--rounds=R]
//                                          [--budget=BYTES] [--only=CONTENDER]
//                                          [--sweep=MIB,MIB,...]
//
// --sweep times keel's forward+backward at each working-set budget (MiB)
// against naive and the three GEMMs, alternated in one run, and prints the
// memory and time ratios of each: where the memory and time targets meet.
//
// Times: R rounds (default 7); every round runs every contender once, in an
// order rotated from round to round, so that load from other processes on a
// shared machine falls on all of them alike. Reported are the median time of
// each contender and, for each ratio, the median of the per-round ratios.
//
// Peak memory is measured, not computed: a c10::MemoryReportingInfoBase is
// installed as the thread's profiler state, so c10's CPU allocator reports
// every allocation and free made on this thread while it is installed (the
// inputs, made before, are not counted; dX and dW, made during backward,
// are). Scratch memory of the BLAS library is outside c10 and not counted,
// for either contender.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <keel/keel.h>

#include "peak_tracker.h"

namespace {

using keel::bench::PeakTracker;

struct Size {
  std::int64_t n, d, v;
};

struct Inputs {
  at::Tensor hidden, weight, target;
};

Inputs make_inputs(const Size& size) {
  at::manual_seed(0);
  Inputs in;
  in.hidden = at::randn({size.n, size.d}).requires_grad_(true);
  in.weight = (at::randn({size.v, size.d}) * 0.05).requires_grad_(true);
  in.target = at::randint(0, size.v, {size.n}, at::kLong);
  return in;
}

struct Contender {
  Contender(std::string n, bool b, std::function<void(const Inputs&)> s)
      : name(std::move(n)), backward(b), step(std::move(s)) {}
  std::string name;
  bool backward;  // forward+backward (6 N D V flops) or forward only (2 N D V)
  std::function<void(const Inputs&)> step;
  double peak_bytes = 0;
  std::vector<double> seconds;  // one per round
};

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t m = x.size() / 2;
  return x.size() % 2 == 1 ? x[m] : 0.5 * (x[m - 1] + x[m]);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines show up as they come, even in a file
  Size size{4096, 1024, 32768};
  int rounds = 7;
  std::int64_t budget = 0;
  std::string only;                 // --only=NAME: time one contender alone (for a profiler)
  std::vector<std::int64_t> sweep;  // --sweep=MiB,...: budgets to compare
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--size=ci") {
      size = {4096, 1024, 32768};
    } else if (arg == "--size=large") {
      size = {8192, 2048, 128256};
    } else if (arg == "--size=small") {
      size = {512, 256, 8192};
    } else if (arg.rfind("--rounds=", 0) == 0) {
      rounds = std::max(0, std::atoi(arg.c_str() + 9));
    } else if (arg.rfind("--only=", 0) == 0) {
      only = arg.substr(7);
    } else if (arg.rfind("--budget=", 0) == 0) {
      budget = std::atoll(arg.c_str() + 9);
    } else if (arg.rfind("--sweep=", 0) == 0) {
      for (const char* p = arg.c_str() + 8; *p != '\0';) {
        char* end = nullptr;
        sweep.push_back(std::strtoll(p, &end, 10) << 20);
        p = *end == ',' ? end + 1 : end;
        if (sweep.back() <= 0 || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "keel_loss_bench: bad --sweep list %s\n", arg.c_str());
          return 2;
        }
      }
    } else {
      std::fprintf(stderr, "keel_loss_bench: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  const Inputs in = make_inputs(size);
  const auto n = static_cast<double>(size.n);
  const auto d = static_cast<double>(size.d);
  const auto v = static_cast<double>(size.v);

  keel::LinearCrossEntropyOptions options;
  options.dispatch.backend = keel::Backend::compat;
  options.chunk_budget_bytes = budget;
  const auto keel_step_with = [](const Inputs& x, bool backward,
                                 const keel::LinearCrossEntropyOptions& o) {
    at::Tensor loss = keel::linear_cross_entropy(x.hidden, x.weight, x.target, o).value().loss;
    if (backward) loss.backward();
  };
  const auto keel_step = [&](const Inputs& x, bool backward) {
    keel_step_with(x, backward, options);
  };
  const auto naive_step = [](const Inputs& x, bool backward) {
    at::Tensor loss = at::cross_entropy_loss(at::linear(x.hidden, x.weight), x.target);
    if (backward) loss.backward();
  };
  // The GEMMs of forward+backward, into preallocated outputs: logits = h W^T,
  // dh = g W, dW = g^T h (g stands in for the logit gradient).
  at::Tensor logits = at::empty({size.n, size.v});
  at::Tensor dh = at::empty({size.n, size.d});
  at::Tensor dw = at::empty({size.v, size.d});
  const auto gemm_step = [&](const Inputs& x) {
    at::NoGradGuard no_grad;
    at::mm_out(logits, x.hidden, x.weight.t());
    at::mm_out(dh, logits, x.weight);
    at::mm_out(dw, logits.t(), x.hidden);
    benchmark::DoNotOptimize(dh.data_ptr());
    benchmark::DoNotOptimize(dw.data_ptr());
  };
  const auto no_grad = [](auto step) {
    return [step](const Inputs& x) {
      at::NoGradGuard guard;
      step(x, false);
    };
  };
  std::vector<Contender> contenders = {
      {"naive_fwd_bwd", true, [&](const Inputs& x) { naive_step(x, true); }},
      {"keel_fwd_bwd", true, [&](const Inputs& x) { keel_step(x, true); }},
      {"three_gemms", true, gemm_step},
      {"naive_fwd_no_grad", false, no_grad(naive_step)},
      {"keel_fwd_no_grad", false, no_grad(keel_step)},
  };
  if (!sweep.empty()) {
    contenders.erase(contenders.begin() + 1);                    // keel at the default budget
    contenders.erase(contenders.begin() + 2, contenders.end());  // no no_grad ones
    for (const std::int64_t bytes : sweep) {
      keel::LinearCrossEntropyOptions o = options;
      o.chunk_budget_bytes = bytes;
      contenders.emplace_back("keel@" + std::to_string(bytes >> 20) + "MiB", true,
                              [keel_step_with, o](const Inputs& x) { keel_step_with(x, true, o); });
    }
  }
  const auto clear = [&] {
    in.hidden.mutable_grad() = at::Tensor();
    in.weight.mutable_grad() = at::Tensor();
  };
  if (!only.empty()) {
    for (Contender& c : contenders) {
      if (c.name != only) continue;
      for (int r = 0; r < rounds; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        c.step(in);
        std::printf(
            "%s %.1f ms\n", c.name.c_str(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3);
        clear();
      }
      return 0;
    }
    std::fprintf(stderr, "keel_loss_bench: no contender named %s\n", only.c_str());
    return 2;
  }

  std::printf("N=%lld D=%lld V=%lld, float32, CPU, %d threads, %d rounds\n",
              static_cast<long long>(size.n), static_cast<long long>(size.d),
              static_cast<long long>(size.v), at::get_num_threads(), rounds);
  // Peak memory of one step each (also the warm-up), outside the timing.
  for (Contender& c : contenders) {
    auto tracker = std::make_shared<PeakTracker>();
    {
      c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, tracker);
      c.step(in);
    }
    clear();
    c.peak_bytes = tracker->peak();
    std::printf("  %-18s peak %10.1f MiB\n", c.name.c_str(), c.peak_bytes / (1 << 20));
  }
  const double dx_dw = 4.0 * (n * d + v * d);
  const auto find = [&](const char* name) -> const Contender& {
    for (const Contender& c : contenders) {
      if (c.name == name) return c;
    }
    std::abort();
  };
  const auto time_ratio = [&](const char* a, const char* b) {
    std::vector<double> ratios;
    const Contender& x = find(a);
    const Contender& y = find(b);
    for (size_t r = 0; r < x.seconds.size(); ++r) ratios.push_back(x.seconds[r] / y.seconds[r]);
    return median(ratios);
  };
  // --sweep: one line per budget (contenders 2...), its time ratios once timed.
  const auto sweep_table = [&] {
    const double naive = find("naive_fwd_bwd").peak_bytes;
    std::printf("%-14s %10s %13s %11s %11s\n", "contender", "mem/naive", "beyond dX+dW",
                "time/naive", "time/GEMMs");
    for (size_t k = 2; k < contenders.size(); ++k) {
      const Contender& c = contenders[k];
      std::printf("%-14s %10.4f %13.4f", c.name.c_str(), c.peak_bytes / naive,
                  (c.peak_bytes - dx_dw) / (naive - dx_dw));
      if (!c.seconds.empty()) {
        std::printf(" %11.3f %11.3f", time_ratio(c.name.c_str(), "naive_fwd_bwd"),
                    time_ratio(c.name.c_str(), "three_gemms"));
      }
      std::printf("\n");
    }
  };
  const auto memory_ratios = [&] {
    const double keel = contenders[1].peak_bytes;
    const double naive = contenders[0].peak_bytes;
    std::printf("  fwd+bwd peak memory      keel/naive       = %.4f  (target <= 0.10)\n",
                keel / naive);
    std::printf(
        "  beyond dX+dW             keel/naive       = %.4f  (target <= 0.05; %.1f / %.1f MiB)\n",
        (keel - dx_dw) / (naive - dx_dw), (keel - dx_dw) / (1 << 20), (naive - dx_dw) / (1 << 20));
  };
  if (rounds == 0) {  // --rounds=0: memory only
    if (sweep.empty()) {
      memory_ratios();
    } else {
      sweep_table();
    }
    return 0;
  }
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < contenders.size(); ++k) {
      Contender& c = contenders[(k + static_cast<size_t>(r)) % contenders.size()];
      const auto t0 = std::chrono::steady_clock::now();
      c.step(in);
      c.seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      clear();
    }
  }

  std::printf("%-18s %10s %10s %10s\n", "contender", "median ms", "GFLOP/s", "peak MiB");
  for (const Contender& c : contenders) {
    const double flops = (c.backward ? 6.0 : 2.0) * n * d * v;
    const double t = median(c.seconds);
    std::printf("%-18s %10.1f %10.1f %10.1f\n", c.name.c_str(), t * 1e3, flops / t / 1e9,
                c.peak_bytes / (1 << 20));
  }
  std::printf("ratios (time: median of per-round ratios; memory: peak c10 bytes)\n");
  if (!sweep.empty()) {
    sweep_table();
    return 0;
  }
  memory_ratios();
  std::printf("  fwd+bwd time             keel/naive       = %.3f  (target <= 1.10)\n",
              time_ratio("keel_fwd_bwd", "naive_fwd_bwd"));
  std::printf("  no_grad forward time     keel/naive       = %.3f  (target <= 1.05)\n",
              time_ratio("keel_fwd_no_grad", "naive_fwd_no_grad"));
  std::printf("  fwd+bwd time             keel/three GEMMs = %.3f  (target <= 1.15)\n",
              time_ratio("keel_fwd_bwd", "three_gemms"));
  std::printf("  no_grad forward peak     keel/naive       = %.4f\n",
              find("keel_fwd_no_grad").peak_bytes / find("naive_fwd_no_grad").peak_bytes);
  return 0;
}
