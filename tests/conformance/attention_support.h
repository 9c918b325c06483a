// What the attention conformance suites share: shapes, seeded inputs, the
// tolerance rule against the float64 reference, and the (adapter, named
// case) fixture.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <keel/keel.h>
#include <torch/csrc/autograd/autograd.h>

#include "conformance/adapters.h"
#include "conformance/error_bounds.h"
#include "reference/attention_reference.h"

namespace keel::attention_suite {

using testing::max_error;

struct Shape {
  std::int64_t B = 2, Hq = 4, Hkv = 2, Lq = 200, Lk = 200, E = 32, Ev = 32;
};

struct Qkv {
  at::Tensor q, k, v;
};

inline Qkv make_qkv(const Shape& s, at::ScalarType dtype = at::kFloat) {
  return {at::randn({s.B, s.Hq, s.Lq, s.E}, at::kDouble).to(dtype),
          at::randn({s.B, s.Hkv, s.Lk, s.E}, at::kDouble).to(dtype),
          at::randn({s.B, s.Hkv, s.Lk, s.Ev}, at::kDouble).to(dtype)};
}

inline AttentionSpec with_masks(std::vector<Mask> masks,
                                MaskCombine combine = MaskCombine::all_of) {
  AttentionSpec spec;
  spec.masks = std::move(masks);
  spec.combine = combine;
  return spec;
}

// Infinities (lse of fully masked rows) must match exactly; no NaN anywhere.
inline void expect_same_infinities(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().to(at::kDouble);
  EXPECT_FALSE(g.isnan().any().item<bool>());
  EXPECT_TRUE(at::equal(g.isneginf(), want.isneginf()));
  EXPECT_TRUE(at::equal(g.isposinf(), want.isposinf()));
}

// FlashAttention's rule: the error against float64 is at most twice that of
// the same-precision naive implementation, plus a small floor.
inline void expect_within_rule(const Qkv& x, const AttentionSpec& spec, const AttentionOutput& got,
                               double floor) {
  const auto [ref_out, ref_lse] = reference::attention(x.q, x.k, x.v, spec);
  const auto [naive_out, naive_lse] = reference::attention(x.q, x.k, x.v, spec, x.q.scalar_type());
  ASSERT_EQ(got.out.sizes(), ref_out.sizes());
  EXPECT_EQ(got.out.scalar_type(), x.q.scalar_type());
  EXPECT_FALSE(got.out.isnan().any().item<bool>());
  const double err = max_error(got.out, ref_out);
  const double naive = max_error(naive_out, ref_out);
  EXPECT_LE(err, 2 * naive + floor) << "out error " << err << ", naive " << naive;
  if (spec.return_lse) {
    ASSERT_TRUE(got.lse.defined());
    EXPECT_EQ(got.lse.sizes(), ref_lse.sizes());
    EXPECT_EQ(got.lse.scalar_type(), x.q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
    expect_same_infinities(got.lse, ref_lse);
    const double lerr = max_error(got.lse, ref_lse);
    const double lnaive = max_error(naive_lse, ref_lse);
    EXPECT_LE(lerr, 2 * lnaive + floor) << "lse error " << lerr << ", naive " << lnaive;
  } else {
    EXPECT_FALSE(got.lse.defined());
  }
}

// The absolute floor of the gradient rule (expect_gradients_within_rule):
// where the naive float32 gradient happens to be exact (an entry of one
// visible key, a zero), keel's equally valid other summation order may
// still round; 1e-6 is a few float32 roundings of the gradients' O(1)-O(10)
// entries here.
constexpr double kGradientFloor = 1e-6;

// The analysis term of the gradient rule. "Twice the naive error" alone
// assumes that keel rounds where the naive implementation rounds. Two
// differences of a fused kernel make it round elsewhere, and this term bounds
// each from an error analysis, so that it holds in any summation order and
// so on any CPU:
// 1. Sums. dq[i] = scale * sum_j dS[i,j] k[j] over the Lk keys; dk[j] =
//    scale * sum dS[i,j] q[i] and dv[j] = sum P[i,j] dO[i] over the group *
//    Lq query rows of a kv head. A kernel that reads each kv head once sums
//    all group * Lq rows in one accumulator, in an order set by the CPU's
//    gemm blocking; the naive one sums each head's Lq rows and then the
//    heads pairwise (repeat_interleave's backward). Measured: 32/1 heads at
//    E = 80 came out at 2.2 times the naive error on one CPU, 1.9 on another.
// 2. Recomputed probabilities. The backward recomputes P = exp(s - lse)
//    from float32 scores and a stored float32 lse, where the naive one
//    differentiates its own softmax (exp(s - max) / sum). The scores' own
//    error is common to both and in the naive error; what the recomputation
//    adds is the rounding of the stored lse (relative u, so u |lse| on s -
//    lse) and of exp: a relative error of P of u (|lse| + 1). It reaches dv
//    through P and dq, dk through dS = P (dP - D).
// Each sum of n terms is bounded by the probabilistic bound lambda sqrt(n) u
// sum |term|, which holds with probability at least 1 - 2n exp(-lambda^2 /
// 2) (Higham and Mary, "A New Approach to Probabilistic Rounding Error
// Analysis", SISC 2019, Theorem 3.1); u is the unit roundoff of the
// accumulation (float32 for every dtype but float64, kernels/accumulation.h),
// lambda = 5. The magnitudes sum |term| come from the float64 reference's P
// and dS, to first order.
struct GradientAnalysisBounds {
  double q = 0, k = 0, v = 0;
};
inline GradientAnalysisBounds gradient_analysis_bounds(const Qkv& x, const AttentionSpec& spec,
                                                       const at::Tensor& up,
                                                       const at::Tensor& up_lse) {
  const at::NoGradGuard no_grad;
  const double lambda = 5.0;
  const double u = x.q.scalar_type() == at::kDouble ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  const std::int64_t B = x.q.size(0), Hq = x.q.size(1), Lq = x.q.size(2), E = x.q.size(3);
  const std::int64_t Hkv = x.k.size(1), Lk = x.k.size(2), group = Hq / Hkv;
  if (x.q.numel() == 0 || Lk == 0) return {};
  const double scale = spec.scale > 0 ? spec.scale : 1.0 / std::sqrt(static_cast<double>(E));
  const at::Tensor q = x.q.detach().to(at::kDouble);
  const at::Tensor k = x.k.detach().to(at::kDouble).repeat_interleave(group, 1);
  const at::Tensor v = x.v.detach().to(at::kDouble).repeat_interleave(group, 1);
  const at::Tensor s = reference::scores(x.q.detach(), x.k.detach(), spec);
  const at::Tensor lse = s.logsumexp(-1, true);
  const at::Tensor p = (s - lse.masked_fill(lse.isinf(), 0)).exp().masked_fill(lse.isinf(), 0);
  const at::Tensor d_o = up.to(at::kDouble);
  const at::Tensor out = p.matmul(v);
  at::Tensor inner = d_o.matmul(v.transpose(2, 3)) - (d_o * out).sum(-1, true);
  if (up_lse.defined()) inner = inner + up_lse.to(at::kDouble).unsqueeze(-1);
  inner = inner.abs();
  // 2: P's absolute error, lambda u (|lse| + 1) P.
  const at::Tensor p_err = p * (lse.masked_fill(lse.isinf(), 0).abs() + 1) * (lambda * u);
  const auto per_kv_head = [&](const at::Tensor& t) {  // [B, Hq, Lk, X] summed over each group
    return t.view({B, Hkv, group, Lk, t.size(3)}).sum(2);
  };
  const auto sums = [&](const at::Tensor& m, std::int64_t n) {  // 1: lambda sqrt(n) u max sum|term|
    return lambda * std::sqrt(static_cast<double>(n)) * u * m.max().item<double>();
  };
  const at::Tensor ds = p * inner;          // |dS|; softcap's tanh' <= 1 only shrinks it
  const at::Tensor ds_err = p_err * inner;  // dS's error through P
  GradientAnalysisBounds b;
  b.q =
      sums(ds.matmul(k.abs()) * scale, Lk) + (ds_err.matmul(k.abs()) * scale).max().item<double>();
  b.k = sums(per_kv_head(ds.transpose(2, 3).matmul(q.abs())) * scale, group * Lq) +
        (per_kv_head(ds_err.transpose(2, 3).matmul(q.abs())) * scale).max().item<double>();
  b.v = sums(per_kv_head(p.transpose(2, 3).matmul(d_o.abs())), group * Lq) +
        per_kv_head(p_err.transpose(2, 3).matmul(d_o.abs())).max().item<double>();
  return b;
}

// The same rule for gradients (FlashAttention's rule for dq, dk and dv):
// the gradients of `inputs` (leaves requiring grad, in the order given)
// under the loss sum(out * up) (+ sum(lse * up_lse) where the call returns
// the lse, -inf rows excluded), keel's against float64 autograd, each within
// twice the error of the same-precision naive implementation's, plus
// `floor`, which the caller justifies.
inline void expect_gradients_within_rule(const Qkv& x, const AttentionSpec& spec,
                                         const AttentionOutput& got,
                                         const std::vector<at::Tensor>& inputs, double floor) {
  ASSERT_TRUE(got.out.defined());
  const at::Tensor up = at::randn(got.out.sizes(), at::kDouble);
  const at::Tensor up_lse = at::randn(got.out.sizes().slice(0, 3), at::kDouble);
  const auto loss_of = [&](const at::Tensor& out, const at::Tensor& lse) {
    at::Tensor loss = (out.to(at::kDouble) * up).sum();
    if (spec.return_lse) {
      loss = loss + (lse.to(at::kDouble).masked_fill(lse.isinf(), 0) * up_lse).sum();
    }
    return loss;
  };
  const auto g = torch::autograd::grad({loss_of(got.out, got.lse)}, inputs);
  const auto [ro, rl] = reference::attention(x.q, x.k, x.v, spec);
  const auto rg = torch::autograd::grad({loss_of(ro, rl)}, inputs);
  const auto [no, nl] = reference::attention(x.q, x.k, x.v, spec, x.q.scalar_type());
  const auto ng = torch::autograd::grad({loss_of(no, nl)}, inputs);
  const GradientAnalysisBounds sums =
      gradient_analysis_bounds(x, spec, up, spec.return_lse ? up_lse : at::Tensor());
  for (std::size_t n = 0; n < g.size(); ++n) {
    SCOPED_TRACE(n == 0 ? "grad q" : n == 1 ? "grad k" : n == 2 ? "grad v" : "grad bias");
    EXPECT_FALSE(g[n].isnan().any().item<bool>());
    const double err = max_error(g[n], rg[n]);
    const double naive = max_error(ng[n], rg[n]);
    // The analysis term of the input this gradient belongs to (by
    // identity: `inputs` may be a subset, in any order).
    double sum = 0;
    if (inputs[n].is_same(x.q)) sum = sums.q;
    if (inputs[n].is_same(x.k)) sum = sums.k;
    if (inputs[n].is_same(x.v)) sum = sums.v;
    EXPECT_LE(err, 2 * naive + floor + sum)
        << "error " << err << ", naive " << naive << ", analysis term " << sum;
  }
}

// A suite parameterised by (adapter, named case): seeded per test, skipped on
// an adapter that declines attention; each case is named in the test's name.
//
// These suites run at libtorch's own intra-op thread count (the machine's
// cores) unless KEEL_TEST_THREADS=N says otherwise: keel's results must not
// depend on it. Until 2026-12-05 they ran on one thread, quarantined: at two
// threads, a process's first decode call came out 100 times the naive
// float32 error in about 1 of 60 fresh processes (`ctest -R
// 'DecodeConformance|PagedConformance' -j4 --repeat until-fail:4`). The cause
// was MKL's vector math, not keel's kernel: the first exp of a process split
// across two threads computed the worker's half at about 12 bits.
// kernels::settle_vector_math() (kernels/vector_math.h) now runs it whole
// first.
inline int threads_for_test() {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read in SetUp, before the test starts threads
  const char* text = std::getenv("KEEL_TEST_THREADS");
  if (text == nullptr) return at::get_num_threads();
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  return end != text && *end == '\0' && n >= 1 && n <= 64 ? static_cast<int>(n)
                                                          : at::get_num_threads();
}

class AdapterAndCase : public ::testing::TestWithParam<std::tuple<Backend, std::string>> {
 protected:
  void SetUp() override {
    at::set_num_threads(threads_for_test());
    at::manual_seed(testing::kSeed);
    if (const std::string why = testing::attention_refusal(adapter()); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }
  void TearDown() override { at::set_num_threads(threads_); }
  Backend adapter() const { return std::get<0>(GetParam()); }
  const std::string& case_name() const { return std::get<1>(GetParam()); }

 private:
  int threads_ = at::get_num_threads();
};

inline std::string adapter_and_case_name(
    const ::testing::TestParamInfo<std::tuple<Backend, std::string>>& info) {
  return std::string(to_string(std::get<0>(info.param))) + "_" + std::get<1>(info.param);
}

// The case of `cases` named `name` (a suite's parameter).
template <class Cases>
const auto& case_named(const Cases& cases, const std::string& name) {
  for (const auto& c : cases) {
    if (c.name == name) return c;
  }
  throw std::logic_error("no case named " + name);
}

template <class Cases>
std::vector<std::string> names_of(const Cases& cases) {
  std::vector<std::string> names;
  for (const auto& c : cases) names.emplace_back(c.name);
  return names;
}

inline Shape decode_shape(std::int64_t B, std::int64_t Hq, std::int64_t Hkv, std::int64_t Lq,
                          std::int64_t Lk, std::int64_t E, std::int64_t Ev) {
  Shape s;
  s.B = B;
  s.Hq = Hq;
  s.Hkv = Hkv;
  s.Lq = Lq;
  s.Lk = Lk;
  s.E = E;
  s.Ev = Ev;
  return s;
}

}  // namespace keel::attention_suite
