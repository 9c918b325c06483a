// keel's block-sparse attention against at::scaled_dot_product_attention
// with the equivalent dense mask, on the CPU in float32, one thread. Prints, after the
// table, the ratios of medians measured in this one run. Interleave the
// contenders' repetitions, so that a neighbour's load falls on both:
//   build/torch-2.15.0/tests/keel_attention_bench --benchmark_enable_random_interleaving=true
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <keel/keel.h>

namespace {

constexpr std::int64_t kLength = 4096;
constexpr std::int64_t kHeads = 8;
constexpr std::int64_t kDim = 64;

struct Inputs {
  at::Tensor q, k, v;
};

Inputs inputs(std::int64_t heads, std::int64_t length) {
  at::manual_seed(0);
  return {at::randn({1, heads, length, kDim}), at::randn({1, heads, length, kDim}),
          at::randn({1, heads, length, kDim})};
}

keel::AttentionSpec window_spec(std::int64_t window) {
  keel::AttentionSpec spec;
  spec.masks = {keel::Mask::sliding_window(window, 0)};
  return spec;
}

keel::AttentionSpec document_spec() {
  keel::AttentionSpec spec;
  const at::Tensor ids = at::arange(kLength, at::kLong).floor_divide(512).view({1, kLength});
  spec.masks = {keel::Mask::document(ids, ids)};
  return spec;
}

at::Tensor dense_window_mask(std::int64_t window) {
  const at::Tensor i = at::arange(kLength).view({kLength, 1});
  const at::Tensor j = at::arange(kLength).view({1, kLength});
  return ((j <= i) & (j >= i - window)).view({1, 1, kLength, kLength});
}

at::Tensor dense_document_mask() {
  const at::Tensor d = at::arange(kLength).floor_divide(512);
  return (d.view({kLength, 1}) == d.view({1, kLength})).view({1, 1, kLength, kLength});
}

void run_keel(benchmark::State& state, const keel::AttentionSpec& spec, std::int64_t heads,
              std::int64_t length, bool backward) {
  const Inputs x = inputs(heads, length);
  if (backward) {
    x.q.requires_grad_(true);
    x.k.requires_grad_(true);
    x.v.requires_grad_(true);
  }
  for (auto _ : state) {
    at::Tensor out = keel::attention(x.q, x.k, x.v, spec).value().out;
    if (backward) out.sum().backward();
    benchmark::DoNotOptimize(out.data_ptr());
  }
}

void run_sdpa(benchmark::State& state, const at::Tensor& mask, bool causal, std::int64_t heads,
              std::int64_t length, bool backward) {
  const Inputs x = inputs(heads, length);
  if (backward) {
    x.q.requires_grad_(true);
    x.k.requires_grad_(true);
    x.v.requires_grad_(true);
  }
  const std::optional<at::Tensor> m =
      mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  for (auto _ : state) {
    at::Tensor out = at::scaled_dot_product_attention(x.q, x.k, x.v, m, 0.0, causal);
    if (backward) out.sum().backward();
    benchmark::DoNotOptimize(out.data_ptr());
  }
}

// Collects the median of each benchmark, to print ratios at the end.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.aggregate_name == "median") medians[r.run_name.function_name] = r.GetAdjustedRealTime();
    }
  }
  std::map<std::string, double> medians;
};

void register_all() {
  const auto reg = [](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->Unit(benchmark::kMillisecond)
        ->Repetitions(5)
        ->ReportAggregatesOnly(true)
        ->MinTime(0.2);
  };
  reg("overhead/keel_causal_L128", [](benchmark::State& s) {
    keel::AttentionSpec spec;
    spec.masks = {keel::Mask::causal()};
    run_keel(s, spec, 8, 128, false);
  });
  reg("overhead/sdpa_causal_L128",
      [](benchmark::State& s) { run_sdpa(s, {}, true, 8, 128, false); });
  reg("window256/keel",
      [](benchmark::State& s) { run_keel(s, window_spec(256), kHeads, kLength, false); });
  reg("window256/sdpa_dense_mask", [](benchmark::State& s) {
    run_sdpa(s, dense_window_mask(256), false, kHeads, kLength, false);
  });
  reg("window256/sdpa_is_causal",
      [](benchmark::State& s) { run_sdpa(s, {}, true, kHeads, kLength, false); });
  reg("document8x512/keel",
      [](benchmark::State& s) { run_keel(s, document_spec(), kHeads, kLength, false); });
  reg("document8x512/sdpa_dense_mask", [](benchmark::State& s) {
    run_sdpa(s, dense_document_mask(), false, kHeads, kLength, false);
  });
  reg("window256_lse/keel", [](benchmark::State& s) {
    keel::AttentionSpec spec = window_spec(256);
    spec.return_lse = true;
    run_keel(s, spec, kHeads, kLength, false);
  });
  reg("window256_fwd_bwd/keel",
      [](benchmark::State& s) { run_keel(s, window_spec(256), kHeads, kLength, true); });
  reg("window256_fwd_bwd/sdpa_dense_mask", [](benchmark::State& s) {
    run_sdpa(s, dense_window_mask(256), false, kHeads, kLength, true);
  });
  reg("document8x512_fwd_bwd/keel",
      [](benchmark::State& s) { run_keel(s, document_spec(), kHeads, kLength, true); });
  reg("document8x512_fwd_bwd/sdpa_dense_mask", [](benchmark::State& s) {
    run_sdpa(s, dense_document_mask(), false, kHeads, kLength, true);
  });
  for (std::int64_t w : {128, 512, 1024, 2048}) {
    reg("sweep/keel_window" + std::to_string(w),
        [w](benchmark::State& s) { run_keel(s, window_spec(w), kHeads, kLength, false); });
  }
}

// Visible fraction of (128 x 128) blocks for a causal window of `w` keys.
double window_density(std::int64_t w) {
  const std::int64_t blocks = kLength / 128;
  std::int64_t visible = 0;
  for (std::int64_t qb = 0; qb < blocks; ++qb) {
    for (std::int64_t kb = 0; kb <= qb; ++kb) {
      if ((kb + 1) * 128 - 1 >= qb * 128 - w) ++visible;
    }
  }
  return static_cast<double>(visible) / static_cast<double>(blocks * blocks);
}

}  // namespace

int main(int argc, char** argv) {
  // One intra-op thread for both sides: on a shared machine, OpenMP barriers
  // of many small ops (keel's tiles) suffer from oversubscription far more
  // than one fused kernel does, which would measure the neighbours, not keel.
  at::set_num_threads(1);
  register_all();
  benchmark::Initialize(&argc, argv);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  auto& m = reporter.medians;
  const auto ratio = [&](const char* label, const std::string& a, const std::string& b) {
    if (m.count(a) == 0 || m.count(b) == 0) return;
    std::printf("%-52s %.3f\n", label, m[a] / m[b]);
  };
  std::printf("\nratios of medians, this run:\n");
  ratio("keel causal / sdpa is_causal (L=128, H=8)", "overhead/keel_causal_L128",
        "overhead/sdpa_causal_L128");
  ratio("window 256: keel / sdpa dense mask", "window256/keel", "window256/sdpa_dense_mask");
  ratio("window 256: keel / sdpa is_causal", "window256/keel", "window256/sdpa_is_causal");
  ratio("documents 8x512: keel / sdpa dense mask", "document8x512/keel",
        "document8x512/sdpa_dense_mask");
  ratio("window 256 with lse: keel / sdpa dense mask", "window256_lse/keel",
        "window256/sdpa_dense_mask");
  ratio("window 256 fwd+bwd: keel / sdpa dense mask", "window256_fwd_bwd/keel",
        "window256_fwd_bwd/sdpa_dense_mask");
  ratio("documents 8x512 fwd+bwd: keel / sdpa dense mask", "document8x512_fwd_bwd/keel",
        "document8x512_fwd_bwd/sdpa_dense_mask");
  const std::string dense = "window256/sdpa_dense_mask";
  for (std::int64_t w : {128, 256, 512, 1024, 2048}) {
    const std::string name = w == 256 ? "window256/keel" : "sweep/keel_window" + std::to_string(w);
    if (m.count(name) == 0 || m.count(dense) == 0) continue;
    const double density = window_density(w);
    std::printf("window %4lld: block density %.3f, keel / dense %.3f, efficiency %.2f\n",
                static_cast<long long>(w), density, m[name] / m[dense],
                density * m[dense] / m[name]);
  }
  benchmark::Shutdown();
  return 0;
}
