// Serving steps: one attention layer of a continuous-batching step, GQA
// 32/8, E = 128, over a paged cache (pages of 16 keys, shuffled pool), in
// float32 and bfloat16. Contenders, interleaved round by round after one
// untimed call each (each timed after an untimed 64 MiB read that evicts the
// others' data):
//   packed   keel::attention(PackedQueries, cache): the whole step, one call
//   padded   every sequence padded to the step's longest query count, one
//            batched paged call (the best a padded batch does)
//   singles  one keel paged call per sequence, summed
// and the machine's limits measured in the same run: the time to read the
// step's visible K and V once (a float32 sum over that many bytes) and the
// step's products at the GEMM peak (float32 512^3). Printed: each median,
// packed / best alternative (goal <= 1), packed / singles (goal <= 1.1),
// and the fraction of the roofline packed reaches.
//
//   build/torch-<release>/tests/keel_serving_step_bench [--threads=2] [--rounds=3]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include "keel/keel.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string flag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind(prefix, 0) == 0) return argv[i] + prefix.size();
  }
  return fallback;
}

struct Step {
  std::string name;
  std::vector<std::int64_t> q_lens, k_lens;
};

constexpr std::int64_t kHq = 32, kHkv = 8, kE = 128, kPage = 16;

struct Built {
  keel::PackedQueries packed;
  keel::PagedKVCache cache;
  at::Tensor padded_q;  // [B, Hq, Lmax, E]
  std::int64_t visible_keys = 0;
  double flops = 0;
};

Built build(const Step& s, at::ScalarType dtype) {
  Built b;
  const auto B = static_cast<std::int64_t>(s.q_lens.size());
  std::vector<std::int64_t> cu{0};
  std::int64_t pages = 0, max_pages = 1, lmax = 0;
  for (std::int64_t i = 0; i < B; ++i) {
    cu.push_back(cu.back() + s.q_lens[i]);
    const std::int64_t n = (s.k_lens[i] + kPage - 1) / kPage;
    pages += n;
    max_pages = std::max(max_pages, n);
    lmax = std::max(lmax, s.q_lens[i]);
    b.visible_keys += s.k_lens[i];
    // q k^T and p v over every query's causal keys (bottom-right).
    for (std::int64_t r = 0; r < s.q_lens[i]; ++r) {
      b.flops += 4.0 * kHq * kE * double(s.k_lens[i] - s.q_lens[i] + 1 + r);
    }
  }
  b.packed.q = at::randn({cu.back(), kHq, kE}).to(dtype);
  b.packed.cu_seqlens_q = at::tensor(cu, at::kLong).to(at::kInt);
  const at::Tensor order = at::randperm(pages, at::kLong);
  b.cache.k_pages = at::randn({pages, kHkv, kPage, kE}).to(dtype);
  b.cache.v_pages = at::randn({pages, kHkv, kPage, kE}).to(dtype);
  b.cache.page_table = at::zeros({B, max_pages}, at::kInt);
  std::int64_t slot = 0;
  for (std::int64_t i = 0; i < B; ++i) {
    for (std::int64_t n = 0; n * kPage < s.k_lens[i]; ++n) {
      b.cache.page_table[i][n] = order[slot++].item<std::int64_t>();
    }
  }
  b.cache.lengths = at::tensor(s.k_lens, at::kLong).to(at::kInt);
  // Padded: each sequence's queries at the end of its Lmax rows (bottom-right).
  b.padded_q = at::zeros({B, kHq, lmax, kE}, dtype);
  for (std::int64_t i = 0; i < B; ++i) {
    if (s.q_lens[i] == 0) continue;
    b.padded_q[i]
        .narrow(1, lmax - s.q_lens[i], s.q_lens[i])
        .copy_(b.packed.q.narrow(0, cu[i], s.q_lens[i]).transpose(0, 1));
  }
  return b;
}

void must(const keel::result<keel::AttentionOutput>& r) {
  if (!r) {
    std::fprintf(stderr, "keel_serving_step_bench: %s\n", r.error().to_string().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = std::stoi(flag(argc, argv, "threads", "2"));
  const int rounds = std::stoi(flag(argc, argv, "rounds", "3"));
  at::set_num_threads(threads);
  c10::InferenceMode inference;
  at::manual_seed(7);
  std::printf(
      "keel serving-step bench: libtorch %s, %d thread(s), %d rounds, medians; GQA 32/8, "
      "E 128, pages of 16\n",
      keel::build_info().torch_version.c_str(), threads, rounds);
  const at::Tensor a = at::randn({512, 512}), bm = at::randn({512, 512});
  (void)at::mm(a, bm);
  std::vector<double> tg;
  for (int r = 0; r < 20; ++r) tg.push_back(seconds([&] { (void)at::mm(a, bm); }));
  const double peak = 2.0 * 512 * 512 * 512 / median(tg);
  std::printf("GEMM peak (float32 512^3): %.1f GFLOP/s\n", peak / 1e9);

  // 32 decodes over 1k-8k keys (seeded), 2 prefill chunks of 256 over 4k;
  // and a decode-only step with 4 speculative tokens per sequence.
  std::vector<Step> steps;
  {
    Step mixed{"32 decodes 1k-8k + 2 prefill chunks of 256 over 4k", {}, {}};
    const at::Tensor lens = at::randint(1024, 8193, {32}, at::kLong);
    for (int i = 0; i < 32; ++i) {
      mixed.q_lens.push_back(1);
      mixed.k_lens.push_back(lens[i].item<std::int64_t>());
    }
    for (int i = 0; i < 2; ++i) {
      mixed.q_lens.push_back(256);
      mixed.k_lens.push_back(4096);
    }
    steps.push_back(mixed);
    Step spec{"32 decodes of 4 speculative tokens + 1, 1k-8k", {}, {}};
    for (int i = 0; i < 32; ++i) {
      spec.q_lens.push_back(5);
      spec.k_lens.push_back(lens[i].item<std::int64_t>());
    }
    steps.push_back(spec);
  }
  keel::AttentionSpec causal;
  causal.masks = {keel::Mask::causal(keel::CausalAlignment::bottom_right)};
  const at::Tensor evict = at::ones({std::int64_t{16} << 20}, at::kFloat);
  const auto flush = [&] { (void)evict.sum().item<float>(); };
  std::printf("%-52s %-8s %9s %9s %9s %9s %9s %10s %9s %8s\n", "step", "dtype", "packed ms",
              "padded ms", "singles", "read ms", "limit ms", "pk/best", "pk/single", "roofline");
  for (const Step& s : steps) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const Built b = build(s, dtype);
      const auto B = static_cast<std::int64_t>(s.q_lens.size());
      const auto packed = [&] { must(keel::attention(b.packed, b.cache, causal)); };
      const auto padded = [&] { must(keel::attention(b.padded_q, b.cache, causal)); };
      const at::Tensor cu_long = b.packed.cu_seqlens_q.to(at::kLong);
      const std::int64_t* cu = cu_long.data_ptr<std::int64_t>();
      const auto singles = [&] {
        for (std::int64_t i = 0; i < B; ++i) {
          keel::PagedKVCache one = b.cache;
          one.page_table = b.cache.page_table.narrow(0, i, 1);
          one.lengths = b.cache.lengths.narrow(0, i, 1);
          const at::Tensor qi =
              b.packed.q.narrow(0, cu[i], cu[i + 1] - cu[i]).transpose(0, 1).unsqueeze(0);
          must(keel::attention(qi, one, causal));
        }
      };
      const std::int64_t bytes = 2 * b.visible_keys * kHkv * kE * at::elementSize(dtype);
      const at::Tensor buf = at::ones({bytes / 4}, at::kFloat);
      const auto read = [&] { (void)buf.sum().item<float>(); };
      packed();
      padded();
      singles();
      read();
      std::vector<double> tp, tpad, ts, tr;
      for (int r = 0; r < rounds; ++r) {
        flush();
        tp.push_back(seconds(packed));
        flush();
        tpad.push_back(seconds(padded));
        flush();
        ts.push_back(seconds(singles));
        flush();
        tr.push_back(seconds(read));
      }
      const double p = median(tp) * 1e3, pad = median(tpad) * 1e3, sg = median(ts) * 1e3,
                   rd = median(tr) * 1e3;
      const double limit = std::max(rd, b.flops / peak * 1e3);
      std::printf("%-52s %-8s %9.2f %9.2f %9.2f %9.2f %9.2f %10.3f %9.3f %7.0f%%\n", s.name.c_str(),
                  dtype == at::kFloat ? "float32" : "bfloat16", p, pad, sg, rd, limit,
                  p / std::min(pad, sg), p / sg, 100 * limit / p);
    }
  }
  return 0;
}
