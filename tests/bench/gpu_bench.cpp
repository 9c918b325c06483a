// keel on a CUDA device, for scripts/gpu-check.sh: attention (bf16, sliding
// window and document masking at L=8192) against SDPA with the same mask as
// a dense boolean tensor, and the fused linear cross-entropy (bf16, N=8192,
// D=4096, V=128256) against the naive at::linear + float() +
// cross_entropy_loss, forward and backward. Writes one JSON object:
//   keel_gpu_bench --out results.json [--quick] [--only attention|loss]
// FlexAttention, which has no C++ entry point, is measured by
// tests/bench/flex_bench.py with the same shapes and masks.
//
// Times are medians of wall-clock milliseconds between device
// synchronisations. Peak memory is the CUDA caching allocator's peak of
// allocated bytes (getDeviceStats) during one forward+backward, above what
// was allocated before it (the inputs).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <keel/keel.h>
#include <torch/csrc/autograd/autograd.h>
#include <nlohmann/json.hpp>

namespace {

using nlohmann::json;

const c10::DeviceIndex kDevice = 0;

// Median milliseconds of `iters` runs after `warmup` runs.
double median_ms(const std::function<void()>& f, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) f();
  c10::cuda::device_synchronize();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    c10::cuda::device_synchronize();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::int64_t allocated_now() {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(kDevice);
  return stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}

// Peak bytes allocated while `f` runs, above what was allocated before.
std::int64_t peak_bytes(const std::function<void()>& f) {
  c10::cuda::device_synchronize();
  const std::int64_t before = allocated_now();
  c10::cuda::CUDACachingAllocator::resetPeakStats(kDevice);
  f();
  c10::cuda::device_synchronize();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(kDevice);
  const std::int64_t peak =
      stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
          .peak;
  return peak - before;
}

// The document lengths of the packed sequence, cycled to fill L (the same
// list as flex_bench.py).
at::Tensor document_ids(std::int64_t length) {
  const std::vector<std::int64_t> pattern = {2048, 512, 1024, 256, 1536, 768, 2048, 1000};
  std::vector<std::int64_t> ids(static_cast<std::size_t>(length));
  std::int64_t pos = 0, doc = 0;
  while (pos < length) {
    const std::int64_t n =
        std::min(pattern[static_cast<std::size_t>(doc) % pattern.size()], length - pos);
    std::fill_n(ids.begin() + pos, n, doc);
    pos += n;
    ++doc;
  }
  return at::tensor(ids, at::kLong);
}

json bench_attention(bool quick) {
  const std::int64_t B = 1, H = 16, L = quick ? 2048 : 8192, E = 128, W = 1024;
  const int warmup = quick ? 1 : 3, iters = quick ? 3 : 10;
  const at::Device cuda(at::kCUDA, kDevice);
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(cuda);
  at::manual_seed(0);
  const at::Tensor q = at::randn({B, H, L, E}, opts);
  const at::Tensor k = at::randn({B, H, L, E}, opts);
  const at::Tensor v = at::randn({B, H, L, E}, opts);
  const at::Tensor up = at::randn({B, H, L, E}, opts);
  const at::Tensor pos = at::arange(L, at::TensorOptions().dtype(at::kLong).device(cuda));
  const at::Tensor qi = pos.view({L, 1}), ki = pos.view({1, L});
  const at::Tensor docs = document_ids(L).to(cuda);

  struct Case {
    std::string name;
    keel::AttentionSpec spec;
    at::Tensor dense;  // bool [1, 1, L, L]
  };
  std::vector<Case> cases;
  {
    Case c{"sliding_window_1024", {}, {}};
    c.spec.masks = {keel::Mask::sliding_window(W, 0)};
    c.dense = ((ki <= qi) & (qi - ki <= W)).view({1, 1, L, L});
    cases.push_back(std::move(c));
  }
  {
    Case c{"document_causal", {}, {}};
    const at::Tensor ids = docs.view({1, L});
    c.spec.masks = {keel::Mask::causal(), keel::Mask::document(ids, ids)};
    c.dense = ((ki <= qi) & (docs.view({L, 1}) == docs.view({1, L}))).view({1, 1, L, L});
    cases.push_back(std::move(c));
  }

  json out = json::object();
  out["shape"] = {{"B", B}, {"H", H}, {"L", L}, {"E", E}, {"dtype", "bfloat16"}};
  for (Case& c : cases) {
    json r;
    std::string path;
    const auto keel_fwd = [&](const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
      auto res = keel::attention(qq, kk, vv, c.spec);
      if (!res) throw std::runtime_error(res.error().to_string());
      path = res.value().dispatch.reason;
      return res.value().out;
    };
    const auto sdpa_fwd = [&](const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv) {
      return at::scaled_dot_product_attention(qq, kk, vv, c.dense);
    };
    const auto fwd_bwd = [&](const auto& fwd) {
      const at::Tensor qg = q.detach().requires_grad_(true);
      const at::Tensor kg = k.detach().requires_grad_(true);
      const at::Tensor vg = v.detach().requires_grad_(true);
      const at::Tensor o = fwd(qg, kg, vg);
      torch::autograd::grad({o}, {qg, kg, vg}, {up});
    };
    {
      const c10::InferenceMode no_grad;
      r["keel_forward_ms"] = median_ms([&] { keel_fwd(q, k, v); }, warmup, iters);
      r["sdpa_dense_mask_forward_ms"] = median_ms([&] { sdpa_fwd(q, k, v); }, warmup, iters);
      const at::Tensor a = keel_fwd(q, k, v).to(at::kFloat);
      const at::Tensor b = sdpa_fwd(q, k, v).to(at::kFloat);
      r["max_abs_difference_keel_vs_sdpa"] = (a - b).abs().max().item<double>();
    }
    r["keel_forward_backward_ms"] = median_ms([&] { fwd_bwd(keel_fwd); }, warmup, iters);
    r["sdpa_dense_mask_forward_backward_ms"] = median_ms([&] { fwd_bwd(sdpa_fwd); }, warmup, iters);
    r["keel_forward_backward_peak_bytes"] = peak_bytes([&] { fwd_bwd(keel_fwd); });
    r["sdpa_dense_mask_forward_backward_peak_bytes"] = peak_bytes([&] { fwd_bwd(sdpa_fwd); });
    r["keel_path"] = path;
    out[c.name] = r;
    std::cerr << "gpu_bench: attention " << c.name << " " << r.dump() << "\n";
  }
  return out;
}

json bench_loss(bool quick) {
  const std::int64_t N = quick ? 2048 : 8192, D = quick ? 1024 : 4096, V = quick ? 32000 : 128256;
  const int warmup = quick ? 1 : 2, iters = quick ? 3 : 5;
  const at::Device cuda(at::kCUDA, kDevice);
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(cuda);
  at::manual_seed(0);
  const at::Tensor hidden = at::randn({N, D}, opts);
  const at::Tensor weight = at::randn({V, D}, opts) * 0.02;
  const at::Tensor target =
      at::randint(0, V, {N}, at::TensorOptions().dtype(at::kLong).device(cuda));

  json out = json::object();
  out["shape"] = {{"N", N}, {"D", D}, {"V", V}, {"dtype", "bfloat16"}};
  const auto naive = [&](const at::Tensor& h, const at::Tensor& w) {
    return at::cross_entropy_loss(at::linear(h, w).to(at::kFloat), target);
  };
  const auto keel_loss = [&](std::int64_t chunk) {
    return [&, chunk](const at::Tensor& h, const at::Tensor& w) {
      keel::LinearCrossEntropyOptions o;
      o.chunk_size = chunk;
      auto r = keel::linear_cross_entropy(h, w, target, o);
      if (!r) throw std::runtime_error(r.error().to_string());
      return r.value().loss;
    };
  };
  const auto fwd_bwd = [&](const auto& f) {
    const at::Tensor h = hidden.detach().requires_grad_(true);
    const at::Tensor w = weight.detach().requires_grad_(true);
    const at::Tensor loss = f(h, w);
    torch::autograd::grad({loss}, {h, w});
    return loss.detach();
  };
  json variants = json::object();
  const auto measure = [&](const std::string& name, const auto& f) {
    json r;
    r["forward_backward_ms"] = median_ms([&] { fwd_bwd(f); }, warmup, iters);
    r["forward_backward_peak_bytes"] = peak_bytes([&] { fwd_bwd(f); });
    const at::Tensor loss = fwd_bwd(f);
    r["loss"] = loss.item<double>();
    std::cerr << "gpu_bench: loss " << name << " " << r.dump() << "\n";
    variants[name] = r;
  };
  measure("naive", naive);
  // chunk 0 is keel's default (a 32 MiB float32 logits block); larger
  // chunks trade memory for fewer, larger GEMMs.
  for (const std::int64_t chunk : {std::int64_t{0}, std::int64_t{1024}, std::int64_t{2048}}) {
    measure("keel_chunk_" + std::to_string(chunk), keel_loss(chunk));
  }
  out["variants"] = variants;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path;
  std::string only;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out_path = argv[++i];
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--quick") {
      quick = true;
    } else {
      std::cerr << "usage: keel_gpu_bench --out FILE [--quick] [--only attention|loss]\n";
      return 2;
    }
  }
  json result;
  result["keel_build"] = {{"torch_version", keel::build_info().torch_version},
                          {"cuda", keel::build_info().cuda}};
  if (!at::hasCUDA()) {
    result["error"] = "no CUDA device visible to libtorch";
    std::cout << result.dump(2) << "\n";
    return 3;
  }
  try {
    if (only.empty() || only == "attention") result["attention"] = bench_attention(quick);
    if (only.empty() || only == "loss") result["loss"] = bench_loss(quick);
  } catch (const std::exception& e) {
    result["error"] = e.what();
    std::cerr << "gpu_bench: " << e.what() << "\n";
  }
  if (!out_path.empty()) {
    std::ofstream(out_path) << result.dump(2) << "\n";
  } else {
    std::cout << result.dump(2) << "\n";
  }
  return result.contains("error") ? 1 : 0;
}
