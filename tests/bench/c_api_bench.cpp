// keel_c_api_bench: what the C ABI costs. The same calls through the plugin
// (loader, table, DLPack in and out) and directly through keel::v1, in one
// process, interleaved round by round; the median of each is printed with
// their ratio, and the difference on tiny tensors is the per-call overhead.
//   keel_c_api_bench [--rounds=N]   (run by hand, never by ctest)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include "keel/c/keel.hpp"
#include "keel/keel.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(const std::function<void()>& f, int calls) {
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) f();
  return std::chrono::duration<double>(Clock::now() - t0).count() / calls;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void row(const char* name, const std::function<void()>& direct, const std::function<void()>& c,
         int calls, int rounds) {
  direct();
  c();
  std::vector<double> d, k;
  for (int r = 0; r < rounds; ++r) {
    d.push_back(seconds(direct, calls));
    k.push_back(seconds(c, calls));
  }
  const double md = median(d), mk = median(k);
  std::printf("%-44s direct %10.2f us   C ABI %10.2f us   C/direct %.3f   overhead %+.2f us\n",
              name, md * 1e6, mk * 1e6, mk / md, (mk - md) * 1e6);
}

keel::c::Tensor dl(const at::Tensor& t) {
  return keel::c::Tensor::adopt(at::toDLPackVersioned(t));
}

void must(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "keel_c_api_bench: %s\n", what.c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--rounds=", 9) == 0) rounds = std::max(1, std::atoi(argv[i] + 9));
  }
  keel::c::LoadOptions o;
  o.plugin_path = KEEL_PLUGIN_FILE;
  keel::c::Result<keel::c::Plugin> loaded = keel::c::Plugin::load(o);
  must(static_cast<bool>(loaded), loaded ? "" : loaded.error().message());
  const keel::c::Plugin& p = loaded.value();
  c10::NoGradGuard no_grad;
  at::manual_seed(1);
  std::printf(
      "keel_c_api_bench: libtorch %s, %d intra-op threads, median of %d interleaved rounds\n",
      keel::build_info().torch_version.c_str(), at::get_num_threads(), rounds);

  {  // Tiny: the fixed cost of a call.
    const at::Tensor x = at::randn({8});
    keel::c::Tensor cx = dl(x);
    row(
        "logsumexp f32 [8]", [&] { must(static_cast<bool>(keel::logsumexp(x)), "v1"); },
        [&] { must(static_cast<bool>(p.logsumexp(cx, -1)), "C"); }, 2000, rounds);
    const at::Tensor q = at::randn({1, 1, 1, 8}), k = at::randn({1, 1, 4, 8});
    keel::c::Tensor cq = dl(q), ck = dl(k);
    row(
        "attention f32 [1,1,1,8] x 4 keys",
        [&] { must(static_cast<bool>(keel::attention(q, k, k)), "v1"); },
        [&] { must(static_cast<bool>(p.attention(cq, ck, ck, nullptr)), "C"); }, 2000, rounds);
  }
  {  // Decode: GQA 32/8, E 128, bfloat16, causal bottom-right.
    const at::Tensor q = at::randn({8, 32, 1, 128}).to(at::kBFloat16);
    const at::Tensor k = at::randn({8, 8, 4096, 128}).to(at::kBFloat16);
    const at::Tensor v = at::randn({8, 8, 4096, 128}).to(at::kBFloat16);
    keel::AttentionSpec spec;
    spec.masks.push_back(keel::Mask::causal(keel::CausalAlignment::bottom_right));
    keel::c::AttentionSpec cspec;
    cspec.add(keel::c::mask(KEEL_MASK_CAUSAL, KEEL_ALIGN_BOTTOM_RIGHT));
    keel::c::Tensor cq = dl(q), ck = dl(k), cv = dl(v);
    row(
        "decode bf16 B=8 32/8 Lk=4096 E=128",
        [&] { must(static_cast<bool>(keel::attention(q, k, v, spec)), "v1"); },
        [&] { must(static_cast<bool>(p.attention(cq, ck, cv, cspec.get())), "C"); }, 5, rounds);
  }
  {  // The fused loss, forward: N 1024, D 1024, V 32768, float32.
    const at::Tensor h = at::randn({1024, 1024}), w = at::randn({32768, 1024}) * 0.02;
    const at::Tensor t = at::randint(0, 32768, {1024}, at::kLong);
    keel::c::Tensor ch = dl(h), cw = dl(w), ct = dl(t);
    KEEL_LinearCrossEntropy_Options co = keel::c::make_args<KEEL_LinearCrossEntropy_Options>();
    row(
        "loss forward f32 N=1024 D=1024 V=32768",
        [&] { must(static_cast<bool>(keel::linear_cross_entropy(h, w, t)), "v1"); },
        [&] { must(static_cast<bool>(p.loss_forward(ch, cw, ct, &co)), "C"); }, 1, rounds);
  }
  return 0;
}
