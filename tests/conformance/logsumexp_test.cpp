// logsumexp on every adapter of this build against the float64 reference.
#include <cmath>
#include <limits>
#include <tuple>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "conformance/adapters.h"
#include "reference/logsumexp_reference.h"

namespace keel {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

class LogsumexpConformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { at::manual_seed(testing::kSeed); }
  LogsumexpOptions options_for(std::int64_t dim = -1, bool keepdim = false) const {
    LogsumexpOptions o;
    o.dim = dim;
    o.keepdim = keepdim;
    o.dispatch.backend = GetParam();
    return o;
  }
  // Native serves no mask: the same call must then say unsupported.
  bool serves_mask() const { return GetParam() != Backend::native; }
};

void expect_close(const at::Tensor& got, const at::Tensor& want, double tolerance) {
  ASSERT_EQ(got.sizes(), want.sizes());
  const at::Tensor g = got.to(at::kDouble);
  // Infinities must match exactly; finite entries within tolerance.
  EXPECT_TRUE(at::equal(g.isposinf(), want.isposinf()));
  EXPECT_TRUE(at::equal(g.isneginf(), want.isneginf()));
  EXPECT_FALSE(g.isnan().any().item<bool>());
  const at::Tensor finite = want.isfinite();
  const double err = (g - want).abs().masked_select(finite).max().item<double>();
  const double scale = want.abs().masked_select(finite).max().item<double>();
  EXPECT_LE(err, tolerance * std::max(1.0, scale)) << "max abs error " << err;
}

TEST_P(LogsumexpConformance, MatchesFloat64ReferenceForEveryDtype) {
  const at::Tensor base = at::randn({5, 7, 33}, at::kDouble) * 3;
  for (const auto& [dtype, tol] : {std::tuple{at::kDouble, 1e-12}, std::tuple{at::kFloat, 2e-6},
                                   std::tuple{at::kBFloat16, 2e-6}, std::tuple{at::kHalf, 2e-6}}) {
    SCOPED_TRACE(c10::toString(dtype));
    // The reference sees the same rounded input: only accumulation is tested.
    const at::Tensor x = base.to(dtype);
    for (std::int64_t dim : {0, 1, 2, -1}) {
      for (bool keepdim : {false, true}) {
        auto r = logsumexp(x, options_for(dim, keepdim));
        ASSERT_TRUE(r) << r.error().to_string();
        EXPECT_EQ(r.value().value.scalar_type(), dtype == at::kDouble ? at::kDouble : at::kFloat);
        EXPECT_EQ(r.value().dispatch.served, GetParam());
        expect_close(r.value().value, reference::logsumexp(x, {}, dim, keepdim), tol);
      }
    }
  }
}

TEST_P(LogsumexpConformance, LargeMagnitudesDoNotOverflow) {
  const at::Tensor x = at::randn({4, 100}, at::kFloat) + 1e4;
  auto r = logsumexp(x, options_for());
  ASSERT_TRUE(r) << r.error().to_string();
  expect_close(r.value().value, reference::logsumexp(x, {}, -1, false), 1e-6);
  auto neg = logsumexp(-x, options_for());
  ASSERT_TRUE(neg);
  expect_close(neg.value().value, reference::logsumexp(-x, {}, -1, false), 1e-6);
}

TEST_P(LogsumexpConformance, AllMinusInfRowGivesMinusInfAndZeroGradient) {
  at::Tensor x = at::randn({3, 6}, at::kDouble);
  x[1].fill_(-kInf);
  x.requires_grad_(true);
  auto r = logsumexp(x, options_for());
  ASSERT_TRUE(r) << r.error().to_string();
  const at::Tensor lse = r.value().value;
  EXPECT_TRUE(std::isinf(lse[1].item<double>()) && lse[1].item<double>() < 0);
  const at::Tensor grad = torch::autograd::grad({lse.sum()}, {x})[0];
  EXPECT_FALSE(grad.isnan().any().item<bool>());
  EXPECT_TRUE(at::allclose(grad, reference::logsumexp_gradient(x, {}, -1), 1e-12, 1e-12));
}

TEST_P(LogsumexpConformance, InfAndNanPropagate) {
  at::Tensor x = at::randn({3, 4}, at::kFloat);
  x[0][2] = kInf;
  x[2][1] = std::numeric_limits<float>::quiet_NaN();
  auto r = logsumexp(x, options_for());
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_TRUE(std::isinf(r.value().value[0].item<float>()));
  EXPECT_GT(r.value().value[0].item<float>(), 0);
  EXPECT_TRUE(std::isfinite(r.value().value[1].item<float>()));
  EXPECT_TRUE(std::isnan(r.value().value[2].item<float>()));
}

TEST_P(LogsumexpConformance, GradientIsTheSoftmax) {
  const at::Tensor x = at::randn({6, 40}, at::kFloat).requires_grad_(true);
  const at::Tensor upstream = at::randn({6}, at::kFloat);
  auto r = logsumexp(x, options_for());
  ASSERT_TRUE(r) << r.error().to_string();
  const at::Tensor grad = torch::autograd::grad({r.value().value}, {x}, {upstream})[0];
  const at::Tensor want =
      reference::logsumexp_gradient(x, {}, -1) * upstream.to(at::kDouble).unsqueeze(1);
  EXPECT_TRUE(at::allclose(grad.to(at::kDouble), want, 1e-5, 1e-7));
}

TEST_P(LogsumexpConformance, NonContiguousAndExpandedInputs) {
  const at::Tensor base = at::randn({8, 16}, at::kFloat);
  const at::Tensor transposed = base.t();                          // strides (1, 16)
  const at::Tensor expanded = at::randn({1, 16}).expand({5, 16});  // stride 0
  for (const at::Tensor& x : {transposed, expanded}) {
    auto r = logsumexp(x, options_for());
    ASSERT_TRUE(r) << r.error().to_string();
    expect_close(r.value().value, reference::logsumexp(x, {}, -1, false), 2e-6);
  }
}

TEST_P(LogsumexpConformance, MaskKeepsOnlyTrueEntriesAndEmptyRowsAreMinusInf) {
  const at::Tensor x = at::randn({4, 3, 20}, at::kDouble).requires_grad_(true);
  at::Tensor mask = at::rand({3, 20}) > 0.5;  // broadcast over the first dim
  mask[2].fill_(false);                       // an empty row in every batch
  LogsumexpOptions o = options_for();
  o.mask = mask;
  auto r = logsumexp(x, o);
  if (!serves_mask()) {
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Errc::unsupported);
    EXPECT_NE(r.error().message().find("mask"), std::string::npos) << r.error().message();
    return;
  }
  ASSERT_TRUE(r) << r.error().to_string();
  expect_close(r.value().value, reference::logsumexp(x, mask, -1, false), 1e-12);
  const at::Tensor grad = torch::autograd::grad({r.value().value.sum()}, {x})[0];
  EXPECT_FALSE(grad.isnan().any().item<bool>());
  EXPECT_TRUE(at::allclose(grad, reference::logsumexp_gradient(x, mask, -1), 1e-12, 1e-12));
}

TEST_P(LogsumexpConformance, BadInputIsInvalidArgumentNamingTheArgument) {
  struct Case {
    const char* what;
    at::Tensor input;
    at::Tensor mask;
    std::int64_t dim;
    const char* names;
  };
  const Case cases[] = {
      {"undefined", at::Tensor(), {}, -1, "input"},
      {"int64", at::zeros({3}, at::kLong), {}, -1, "dtype"},
      {"bool", at::zeros({3}, at::kBool), {}, -1, "dtype"},
      {"scalar", at::zeros({}), {}, 0, "0-dimensional"},
      {"dim too large", at::zeros({2, 3}), {}, 2, "options.dim"},
      {"dim too small", at::zeros({2, 3}), {}, -3, "options.dim"},
      {"mask dtype", at::zeros({2, 3}), at::ones({2, 3}), -1, "options.mask"},
      {"mask shape", at::zeros({2, 3}), at::ones({2, 4}, at::kBool), -1, "options.mask"},
      {"mask rank", at::zeros({3}), at::ones({2, 3}, at::kBool), -1, "options.mask"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    LogsumexpOptions o = options_for(c.dim);
    o.mask = c.mask;
    auto r = logsumexp(c.input, o);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Errc::invalid_argument);
    EXPECT_NE(r.error().message().find(c.names), std::string::npos) << r.error().message();
    EXPECT_EQ(r.error().message().rfind("logsumexp: ", 0), 0u) << r.error().message();
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAdapter, LogsumexpConformance,
                         ::testing::ValuesIn(testing::adapters_in_build()), testing::adapter_name);

}  // namespace
}  // namespace keel
