// keel::linear_cross_entropy against the naive at::linear +
// at::cross_entropy_loss, on CPU in float32: forward+backward time, forward
// time under no_grad, the three GEMMs of the same shapes alone, and the peak
// memory of one forward+backward. Built, not run by ctest:
//   build/torch-2.13/tests/keel_loss_bench [--size=ci|large] [benchmark flags]
//
// Peak memory is measured, not computed: a c10::MemoryReportingInfoBase is
// installed as the thread's profiler state, so c10's CPU allocator reports
// every allocation and free made on this thread while it is installed (the
// inputs, made before, are not counted; dX and dW, made during backward,
// are). Scratch memory of the BLAS library is outside c10 and not counted,
// for either variant.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <benchmark/benchmark.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <keel/keel.h>

namespace {

struct Size {
  std::int64_t n, d, v;
};
Size g_size{2048, 512, 32768};

class PeakTracker final : public c10::MemoryReportingInfoBase {
 public:
  // alloc_size is negative for a free. c10's own running total is not used:
  // frees made while no tracker is installed never leave it.
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device /*device*/) override {
    current_ += alloc_size;
    peak_ = std::max(peak_, current_);
  }
  bool memoryProfilingEnabled() const override { return true; }
  size_t peak() const { return static_cast<size_t>(peak_); }

 private:
  int64_t current_ = 0;
  int64_t peak_ = 0;
};

struct Inputs {
  at::Tensor hidden, weight, target;
};

Inputs make_inputs() {
  at::manual_seed(0);
  Inputs in;
  in.hidden = at::randn({g_size.n, g_size.d}).requires_grad_(true);
  in.weight = (at::randn({g_size.v, g_size.d}) * 0.05).requires_grad_(true);
  in.target = at::randint(0, g_size.v, {g_size.n}, at::kLong);
  return in;
}

void keel_step(const Inputs& in, bool backward) {
  keel::LinearCrossEntropyOptions o;
  o.dispatch.backend = keel::Backend::compat;
  at::Tensor loss = keel::linear_cross_entropy(in.hidden, in.weight, in.target, o).value().loss;
  if (backward) loss.backward();
}

void naive_step(const Inputs& in, bool backward) {
  at::Tensor loss = at::cross_entropy_loss(at::linear(in.hidden, in.weight), in.target);
  if (backward) loss.backward();
}

// The GEMMs of forward+backward: logits = h W^T, dh = g W, dW = g^T h.
void gemm_step(const Inputs& in, bool /*backward*/) {
  at::NoGradGuard no_grad;
  const at::Tensor logits = at::mm(in.hidden, in.weight.t());
  const at::Tensor dh = at::mm(logits, in.weight);
  const at::Tensor dw = at::mm(logits.t(), in.hidden);
  benchmark::DoNotOptimize(dh.data_ptr());
  benchmark::DoNotOptimize(dw.data_ptr());
}

struct Figures {
  double seconds = 0;  // median
  double peak_bytes = 0;
};
std::map<std::string, Figures> g_figures;

template <void (*Step)(const Inputs&, bool)>
void run(benchmark::State& state, const char* name, bool backward) {
  const Inputs in = make_inputs();
  const auto clear = [&] {
    in.hidden.mutable_grad() = at::Tensor();
    in.weight.mutable_grad() = at::Tensor();
  };
  std::unique_ptr<at::NoGradGuard> no_grad;
  if (!backward) no_grad = std::make_unique<at::NoGradGuard>();
  {
    // Peak memory of one step, outside the timed loop.
    auto tracker = std::make_shared<PeakTracker>();
    {
      c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, tracker);
      Step(in, backward);
    }
    clear();
    g_figures[name].peak_bytes = static_cast<double>(tracker->peak());
    state.counters["peak_MiB"] = static_cast<double>(tracker->peak()) / (1 << 20);
  }
  std::vector<double> times;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    Step(in, backward);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    state.PauseTiming();
    clear();
    state.ResumeTiming();
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  g_figures[name].seconds = median;
  const double flops = (backward ? 6.0 : 2.0) * static_cast<double>(g_size.n) *
                       static_cast<double>(g_size.d) * static_cast<double>(g_size.v);
  state.counters["GFLOP/s"] = flops / median / 1e9;
}

void BM_NaiveForwardBackward(benchmark::State& s) {
  run<naive_step>(s, "naive_fwd_bwd", true);
}
void BM_KeelForwardBackward(benchmark::State& s) {
  run<keel_step>(s, "keel_fwd_bwd", true);
}
void BM_NaiveForwardNoGrad(benchmark::State& s) {
  run<naive_step>(s, "naive_fwd", false);
}
void BM_KeelForwardNoGrad(benchmark::State& s) {
  run<keel_step>(s, "keel_fwd", false);
}
void BM_ThreeGemms(benchmark::State& s) {
  run<gemm_step>(s, "three_gemms", true);
}

BENCHMARK(BM_NaiveForwardBackward)->Iterations(5)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_KeelForwardBackward)->Iterations(5)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_NaiveForwardNoGrad)->Iterations(5)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_KeelForwardNoGrad)->Iterations(5)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_ThreeGemms)->Iterations(5)->Unit(benchmark::kMillisecond)->UseRealTime();

double ratio(const char* a, const char* b, double Figures::*field) {
  return g_figures[a].*field / g_figures[b].*field;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--size=large") == 0) {
      g_size = {8192, 2048, 128256};
    } else if (std::strcmp(argv[i], "--size=small") == 0) {
      g_size = {512, 256, 8192};
    } else if (std::strcmp(argv[i], "--size=ci") != 0) {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  std::printf("N=%lld D=%lld V=%lld, float32, %d threads\n", static_cast<long long>(g_size.n),
              static_cast<long long>(g_size.d), static_cast<long long>(g_size.v),
              at::get_num_threads());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (g_figures.size() == 5) {
    std::printf("ratios (median times, peak c10 bytes):\n");
    std::printf("  fwd+bwd time     keel/naive = %.3f\n",
                ratio("keel_fwd_bwd", "naive_fwd_bwd", &Figures::seconds));
    std::printf("  fwd+bwd peak mem keel/naive = %.3f\n",
                ratio("keel_fwd_bwd", "naive_fwd_bwd", &Figures::peak_bytes));
    std::printf("  no_grad fwd time keel/naive = %.3f\n",
                ratio("keel_fwd", "naive_fwd", &Figures::seconds));
    std::printf("  no_grad fwd peak keel/naive = %.3f\n",
                ratio("keel_fwd", "naive_fwd", &Figures::peak_bytes));
    std::printf("  fwd+bwd time keel/three GEMMs = %.3f\n",
                ratio("keel_fwd_bwd", "three_gemms", &Figures::seconds));
    const double dx_dw = 4.0 * static_cast<double>(g_size.n * g_size.d + g_size.v * g_size.d);
    std::printf("  beyond dX+dW: keel %.1f MiB, naive %.1f MiB, ratio %.3f\n",
                (g_figures["keel_fwd_bwd"].peak_bytes - dx_dw) / (1 << 20),
                (g_figures["naive_fwd_bwd"].peak_bytes - dx_dw) / (1 << 20),
                (g_figures["keel_fwd_bwd"].peak_bytes - dx_dw) /
                    (g_figures["naive_fwd_bwd"].peak_bytes - dx_dw));
  }
  return 0;
}
