// Decode: one query per sequence (Lq = 1) against a KV cache, the shape a
// serving engine runs, contiguous or paged (pages of 16 keys in a shuffled
// pool); and chunked prefill (Lq = 64 or 512 new tokens against the cache).
// keel::attention against the best a libtorch user writes by hand for the
// same visible keys (at::scaled_dot_product_attention with enable_gqa, keys
// sliced to the window, a boolean mask for ragged lengths, documents and
// bottom-right causal prefill; a paged cache gathered with index_select
// first), and against the machine's memory bandwidth, measured in the same
// run as the time to read the same number of bytes (a float32 sum over a
// buffer of that many bytes), and against the machine's GEMM peak (a
// 512^3 float32 matmul, once per run): "limit" is the larger of the read
// time and the two products' flops at that peak, the roofline of the case.
//
//   build/torch-<release>/tests/keel_decode_bench [--threads=1] [--rounds=5] [--filter=SUBSTRING]
//
// Each case: the contenders alternate, round after round (keel, SDPA, read,
// each after an untimed read of 64 MiB that evicts the others' data), after
// one untimed call each; the figures are the medians of the rounds.
// Printed per case: keel / SDPA (time ratio, <= 1 is keel faster), the
// fraction of the bandwidth keel reaches (read time / keel time; 1.0 is
// reading the visible K and V once at the speed of a plain read), and the
// fraction of the roofline (limit / keel time).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <keel/keel.h>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Case {
  std::string name;
  std::int64_t B, Hq, Hkv, Lk;
  at::ScalarType dtype;
  std::string mask;  // causal, window512, ragged, documents, paged16
  std::int64_t Lq = 1;
};

constexpr std::int64_t kDim = 128;
constexpr std::int64_t kWindow = 512;

struct Setup {
  at::Tensor q, k, v;
  keel::PagedKVCache paged;  // defined pools: keel reads this instead of k, v
  keel::AttentionSpec spec;
  std::function<at::Tensor()> by_hand;
  double visible_keys = 0;  // summed over the batch
};

Setup make(const Case& c) {
  at::manual_seed(0);
  Setup s;
  s.q = at::randn({c.B, c.Hq, c.Lq, kDim}).to(c.dtype);
  s.k = at::randn({c.B, c.Hkv, c.Lk, kDim}).to(c.dtype);
  s.v = at::randn({c.B, c.Hkv, c.Lk, kDim}).to(c.dtype);
  const bool gqa = c.Hq != c.Hkv;
  const at::Tensor q = s.q, k = s.k, v = s.v;
  if (c.mask == "causal") {
    // Bottom-right causal with Lq = 1: every key is visible.
    s.spec.masks = {keel::Mask::causal(keel::CausalAlignment::bottom_right)};
    s.by_hand = [=] { return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, {}, gqa); };
    s.visible_keys = static_cast<double>(c.B * c.Lk);
  } else if (c.mask == "window512") {
    s.spec.masks = {keel::Mask::sliding_window(kWindow, 0, keel::CausalAlignment::bottom_right)};
    const std::int64_t n = std::min(c.Lk, kWindow + 1);
    s.by_hand = [=] {
      return at::scaled_dot_product_attention(q, k.narrow(2, c.Lk - n, n), v.narrow(2, c.Lk - n, n),
                                              {}, 0.0, false, {}, gqa);
    };
    s.visible_keys = static_cast<double>(c.B * n);
  } else if (c.mask == "ragged") {
    // Lengths spread over [Lk / 4, Lk]: a batch of sequences of different ages.
    const at::Tensor lengths =
        at::linspace(static_cast<double>(c.Lk) / 4, static_cast<double>(c.Lk), c.B).to(at::kLong);
    s.spec.masks = {keel::Mask::causal(keel::CausalAlignment::bottom_right),
                    keel::Mask::key_padding(lengths)};
    const at::Tensor keep =
        (at::arange(c.Lk, at::kLong).view({1, 1, 1, -1}) < lengths.view({-1, 1, 1, 1}));
    s.by_hand = [=] {
      return at::scaled_dot_product_attention(q, k, v, keep, 0.0, false, {}, gqa);
    };
    s.visible_keys = lengths.sum().item<double>();
  } else if (c.mask == "paged16") {
    // Every sequence Lk keys long, in pages of 16 spread over a shuffled
    // pool; by hand: the pages gathered into a contiguous cache, then SDPA.
    constexpr std::int64_t kPage = 16;
    const std::int64_t per = c.Lk / kPage;
    const at::Tensor ids = at::randperm(c.B * per, at::kLong);
    const at::Tensor slots = at::empty_like(ids);
    slots.index_put_({ids}, at::arange(c.B * per, at::kLong));  // page id -> its slot
    const auto pool = [&](const at::Tensor& t) {
      // [B, H, Lk, E] -> pages [B * per, H, 16, E], then page n at id ids[n].
      const at::Tensor pages = t.view({c.B, c.Hkv, per, kPage, kDim})
                                   .permute({0, 2, 1, 3, 4})
                                   .reshape({c.B * per, c.Hkv, kPage, kDim});
      return pages.index_select(0, slots).contiguous();
    };
    s.paged.k_pages = pool(k);
    s.paged.v_pages = pool(v);
    s.paged.page_table = ids.view({c.B, per});
    s.paged.lengths = at::full({c.B}, c.Lk, at::kLong);
    s.spec.masks = {keel::Mask::causal(keel::CausalAlignment::bottom_right)};
    const keel::PagedKVCache p = s.paged;
    s.by_hand = [=] {
      const auto gather = [&](const at::Tensor& pages) {
        return pages.index_select(0, p.page_table.flatten())
            .view({c.B, per, c.Hkv, kPage, kDim})
            .permute({0, 2, 1, 3, 4})
            .reshape({c.B, c.Hkv, c.Lk, kDim});
      };
      return at::scaled_dot_product_attention(q, gather(p.k_pages), gather(p.v_pages), {}, 0.0,
                                              false, {}, gqa);
    };
    s.visible_keys = static_cast<double>(c.B * c.Lk);
  } else if (c.mask == "prefill" || c.mask == "prefill_window512") {
    // Lq new tokens at the end of the cache: bottom-right causal, optionally
    // windowed; by hand, the equivalent boolean mask [Lq, Lk].
    const bool window = c.mask != "prefill";
    s.spec.masks = {
        window ? keel::Mask::sliding_window(kWindow, 0, keel::CausalAlignment::bottom_right)
               : keel::Mask::causal(keel::CausalAlignment::bottom_right)};
    const at::Tensor pos = at::arange(c.Lq, at::kLong).view({-1, 1}) + (c.Lk - c.Lq);
    const at::Tensor key = at::arange(c.Lk, at::kLong).view({1, -1});
    at::Tensor keep = key <= pos;
    if (window) keep = keep.logical_and(key >= pos - kWindow);
    s.by_hand = [=] {
      return at::scaled_dot_product_attention(q, k, v, keep, 0.0, false, {}, gqa);
    };
    s.visible_keys = static_cast<double>(c.B * (window ? std::min(c.Lk, kWindow + c.Lq) : c.Lk));
  } else {
    // Documents of 1000 tokens packed in each row; the query is the last
    // token of the last one.
    const at::Tensor kv_ids =
        at::div(at::arange(c.Lk, at::kLong), 1000, "floor").expand({c.B, c.Lk}).contiguous();
    const at::Tensor q_ids = kv_ids.narrow(1, c.Lk - 1, 1).contiguous();
    s.spec.masks = {keel::Mask::document(q_ids, kv_ids),
                    keel::Mask::causal(keel::CausalAlignment::bottom_right)};
    const at::Tensor keep = (kv_ids == q_ids).view({c.B, 1, 1, c.Lk});
    s.by_hand = [=] {
      return at::scaled_dot_product_attention(q, k, v, keep, 0.0, false, {}, gqa);
    };
    s.visible_keys = static_cast<double>(c.B * (c.Lk - (c.Lk - 1) / 1000 * 1000));
  }
  return s;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (std::int64_t B : {1, 8}) {
      for (std::int64_t Lk : {1024, 8192, 32768}) {
        for (std::int64_t Hkv : {32, 8, 1}) {
          for (const char* mask : {"causal", "window512", "ragged", "documents", "paged16"}) {
            if (B == 1 && std::string(mask) == "ragged") continue;  // one sequence: no raggedness
            // The hand-written paged contender gathers two copies of the
            // cache beside the pools: past this machine's 23 GiB at B=8, Lk=32768.
            if (B == 8 && Lk == 32768 && std::string(mask) == "paged16") continue;
            Case c{"", B, 32, Hkv, Lk, dtype, mask};
            char name[128];
            std::snprintf(name, sizeof(name), "%s B=%lld Lk=%lld 32/%lld %s",
                          dtype == at::kFloat ? "f32" : "bf16", static_cast<long long>(B),
                          static_cast<long long>(Lk), static_cast<long long>(Hkv), mask);
            c.name = name;
            cases.push_back(c);
          }
        }
      }
    }
  }
  // Chunked prefill: one sequence, 32/8 heads.
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (std::int64_t Lk : {4096, 8192}) {
      for (std::int64_t Lq : {64, 512}) {
        for (const char* mask : {"prefill", "prefill_window512"}) {
          Case c{"", 1, 32, 8, Lk, dtype, mask, Lq};
          char name[128];
          std::snprintf(name, sizeof(name), "%s B=1 Lk=%lld 32/8 Lq=%lld %s",
                        dtype == at::kFloat ? "f32" : "bf16", static_cast<long long>(Lk),
                        static_cast<long long>(Lq), mask);
          c.name = name;
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}

std::string flag(int argc, char** argv, const char* name, const char* fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = std::stoi(flag(argc, argv, "threads", "1"));
  const int rounds = std::stoi(flag(argc, argv, "rounds", "5"));
  const std::string filter = flag(argc, argv, "filter", "");
  at::set_num_threads(threads);
  c10::InferenceMode inference;
  std::printf("keel decode bench: libtorch %s, %d thread(s), %d rounds, medians\n",
              keel::build_info().torch_version.c_str(), threads, rounds);
  // The GEMM peak: a float32 512^3 product, in cache.
  const at::Tensor a = at::randn({512, 512});
  const at::Tensor b = at::randn({512, 512});
  (void)at::mm(a, b);
  std::vector<double> tg;
  for (int r = 0; r < 20; ++r) tg.push_back(seconds([&] { (void)at::mm(a, b); }));
  const double peak_flops = 2.0 * 512 * 512 * 512 / median(tg);
  std::printf("GEMM peak (float32 512^3): %.1f GFLOP/s\n", peak_flops / 1e9);
  std::printf("%-44s %9s %9s %9s %9s %9s %9s %8s %8s\n", "case", "keel ms", "SDPA ms", "read ms",
              "limit ms", "keel/SDPA", "bandwidth", "of limit", "GB/s");
  double worst_ratio = 0;
  double worst_bw_long = 1e9;
  double worst_limit_long = 1e9;
  bool long_ran = false;                    // a case at Lk >= 8192, Lq = 1 ran
  bool long_full_ran = false;               // one of them reads every key
  std::map<std::string, double> causal_ms;  // keel's time on the contiguous cache, by shape
  double paged_lo = 1e9, paged_hi = 0;
  const at::Tensor evict = at::ones({std::int64_t{16} << 20}, at::kFloat);  // 64 MiB
  for (const Case& c : all_cases()) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    Setup s = make(c);
    const double bytes = s.visible_keys * static_cast<double>(c.Hkv * kDim * 2) *
                         static_cast<double>(c10::elementSize(c.dtype));
    const at::Tensor buffer = at::ones({static_cast<std::int64_t>(bytes / 4)}, at::kFloat);
    const auto keel_call = [&] {
      auto r = s.paged.k_pages.defined() ? keel::attention(s.q, s.paged, s.spec)
                                         : keel::attention(s.q, s.k, s.v, s.spec);
      if (!r) {
        std::fprintf(stderr, "keel: %s\n", r.error().to_string().c_str());
        std::exit(1);
      }
    };
    const auto sdpa_call = [&] { (void)s.by_hand(); };
    const auto read_call = [&] { (void)buffer.sum().item<float>(); };
    const auto flush = [&] { (void)evict.sum().item<float>(); };
    keel_call();
    sdpa_call();
    read_call();
    std::vector<double> tk, ts, tr;
    // Each timed call starts from the same cache state: right after an
    // untimed read of another 64 MiB, as a decode step starts after the rest
    // of the model evicted this layer's cache. (In a fixed order each
    // contender would run on the caches the previous one warmed.)
    for (int r = 0; r < rounds; ++r) {
      flush();
      tk.push_back(seconds(keel_call));
      flush();
      ts.push_back(seconds(sdpa_call));
      flush();
      tr.push_back(seconds(read_call));
    }
    const double k_ms = median(tk) * 1e3, s_ms = median(ts) * 1e3, r_ms = median(tr) * 1e3;
    // Scores and output: 2 products of 2 * Lq * E flops per (query head, visible key).
    const double flops = 4.0 * static_cast<double>(c.Hq * c.Lq * kDim) * s.visible_keys;
    const double limit_ms = std::max(r_ms, flops / peak_flops * 1e3);
    const double ratio = k_ms / s_ms;
    const double fraction = r_ms / k_ms;
    if (c.Lk >= 8192 && c.Lq == 1) {
      long_ran = true;
      worst_limit_long = std::min(worst_limit_long, limit_ms / k_ms);
    }
    worst_ratio = std::max(worst_ratio, ratio);
    // The paged case of a shape follows its causal case (same keys, all visible).
    const std::string shape = c.name.substr(0, c.name.rfind(' '));
    if (c.mask == "causal") causal_ms[shape] = k_ms;
    if (c.mask == "paged16" && causal_ms.count(shape) != 0) {
      paged_lo = std::min(paged_lo, k_ms / causal_ms[shape]);
      paged_hi = std::max(paged_hi, k_ms / causal_ms[shape]);
    }
    if (c.Lk >= 8192 && c.Lq == 1 && c.mask != "window512" && c.mask != "documents") {
      long_full_ran = true;
      worst_bw_long = std::min(worst_bw_long, fraction);
    }
    std::printf("%-44s %9.3f %9.3f %9.3f %9.3f %9.2f %8.0f%% %7.0f%% %8.1f\n", c.name.c_str(), k_ms,
                s_ms, r_ms, limit_ms, ratio, 100 * fraction, 100 * limit_ms / k_ms,
                bytes / (k_ms * 1e-3) / 1e9);
    std::fflush(stdout);
  }
  // The long-cache figures exist only where the filter let such cases run.
  std::printf("worst keel/SDPA: %.2f", worst_ratio);
  if (long_ran)
    std::printf("; at Lk >= 8192, Lq = 1: lowest fraction of the roofline %.0f%%",
                100 * worst_limit_long);
  if (long_full_ran)
    std::printf(", lowest bandwidth fraction (full reads) %.0f%%", 100 * worst_bw_long);
  std::printf("\n");
  if (paged_hi > 0) {
    std::printf("keel paged (pages of 16) / keel contiguous, same keys: %.2f .. %.2f\n", paged_lo,
                paged_hi);
  }
  return 0;
}
