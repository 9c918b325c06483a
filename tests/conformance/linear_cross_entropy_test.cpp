// linear_cross_entropy on every adapter of this build against the float64
// reference (tests/reference/linear_cross_entropy_reference.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "conformance/adapters.h"
#include "conformance/error_bounds.h"
#include "engine/peak_memory.h"
#include "reference/linear_cross_entropy_reference.h"
#include "support/loss_options.h"

namespace keel {
namespace {

using testing::max_error;
using torch::autograd::variable_list;

constexpr const char* kNativeReason = "only in Python";

// One row of the option table (tests/support/loss_options.h) and the
// tokens per chunk.
struct Case : testing::LossOptionRow {
  std::int64_t chunk_size;
};

using Inputs = testing::LossInputs;
using testing::reference_case;

constexpr std::int64_t kDim = 24;

// Inputs in float64; a test rounds them to the dtype under test and gives
// the reference the rounded values, so only the computation is compared.
Inputs make_inputs(const Case& c, std::int64_t dim = kDim) {
  return testing::make_loss_inputs(c, dim, 0.4 * std::sqrt(24.0 / dim));
}

const Case kTable[] = {
    // name                      reduction        ignore ign%  smooth cw     bias   cap  z     N   V
    // chunk
    {{"mean_plain", Reduction::mean, -100, 0.0, 0.0, false, false, 0, 0, 17, 37}, 0},
    {{"mean_ignored", Reduction::mean, -100, 0.3, 0.0, false, false, 0, 0, 23, 37}, 5},
    {{"mean_smooth_weights", Reduction::mean, -100, 0.3, 0.2, true, false, 0, 0, 23, 41}, 7},
    {{"mean_weights_bias", Reduction::mean, -100, 0.0, 0.0, true, true, 0, 0, 16, 40}, 3},
    {{"mean_softcap_z", Reduction::mean, -100, 0.2, 0.0, false, true, 2.5, 1e-3, 19, 33}, 4},
    {{"mean_everything", Reduction::mean, -100, 0.25, 0.1, true, true, 3.0, 1e-2, 21, 50}, 8},
    {{"mean_ignore_is_a_class", Reduction::mean, 3, 0.0, 0.1, false, false, 0, 0, 30, 7}, 6},
    {{"sum_plain", Reduction::sum, -100, 0.0, 0.0, false, true, 0, 0, 12, 29}, 5},
    {{"sum_smooth_ignored", Reduction::sum, -100, 0.3, 0.3, false, false, 0, 0, 20, 31}, 1},
    {{"sum_weights_softcap", Reduction::sum, -100, 0.1, 0.0, true, false, 1.5, 0, 14, 64}, 0},
    {{"sum_z", Reduction::sum, -100, 0.0, 0.05, false, true, 0, 1e-2, 9, 33}, 2},
    {{"none_plain", Reduction::none, -100, 0.0, 0.0, false, false, 0, 0, 15, 37}, 4},
    {{"none_everything", Reduction::none, -100, 0.3, 0.15, true, true, 2.0, 1e-2, 22, 45}, 6},
    {{"none_one_token", Reduction::none, -100, 0.0, 0.1, false, true, 0, 0, 1, 19}, 0},
    {{"mean_one_token", Reduction::mean, -100, 0.0, 0.0, true, false, 0, 1e-3, 1, 11}, 0},
    {{"smoothing_one", Reduction::mean, -100, 0.2, 1.0, true, false, 0, 0, 13, 21}, 4},
};

LinearCrossEntropyOptions options_for_backend(const Case& c, const Inputs& in, at::ScalarType dtype,
                                              Backend backend) {
  LinearCrossEntropyOptions o;
  o.reduction = c.reduction;
  o.ignore_index = c.ignore_index;
  o.label_smoothing = c.label_smoothing;
  o.z_loss = c.z_loss;
  o.logit_softcap = c.logit_softcap;
  o.chunk_size = c.chunk_size;
  if (in.class_weights.defined()) o.class_weights = in.class_weights.to(at::kFloat);
  if (in.bias.defined()) o.bias = in.bias.to(dtype);
  o.dispatch.backend = backend;
  return o;
}

class LinearCrossEntropyConformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    at::manual_seed(testing::kSeed);
    // Native declines every call (libtorch 2.13 has the op only in Python);
    // LinearCrossEntropyDispatch pins that, so the numeric suite skips it.
    // Validation runs before dispatch, so the bad-input table runs on native.
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    if (GetParam() == Backend::native && name.find("BadInput") == std::string::npos) {
      GTEST_SKIP() << "native declines linear_cross_entropy";
    }
  }

  LinearCrossEntropyOptions options_for(const Case& c, const Inputs& in,
                                        at::ScalarType dtype) const {
    return options_for_backend(c, in, dtype, GetParam());
  }
};

// Gradients of `loss` (scalar or per token with `upstream`) for the defined
// leaves.
variable_list gradients(const at::Tensor& loss, const variable_list& leaves,
                        const at::Tensor& upstream) {
  variable_list inputs;
  for (const at::Tensor& t : leaves) {
    if (t.defined()) inputs.push_back(t);
  }
  if (loss.dim() == 0) return torch::autograd::grad({loss}, inputs);
  return torch::autograd::grad({loss}, inputs, {upstream.to(loss.scalar_type())});
}

double max_relative_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble);
  return ((g - want).abs().max() / want.abs().max().clamp_min(1e-300)).item<double>();
}

// FlashAttention's rule: keel's error against float64 is at most twice the
// error of the naive computation in the same precision. The floor, four
// float32 roundings of the largest entry, is for entries the naive
// computation happens to get exact, where keel's other (equally valid)
// summation order still rounds.
void expect_within_naive(const at::Tensor& got, const at::Tensor& naive, const at::Tensor& want) {
  const double floor =
      4 * std::numeric_limits<float>::epsilon() * std::max(1.0, want.abs().max().item<double>());
  const double err = max_error(got, want);
  const double naive_err = max_error(naive, want);
  EXPECT_LE(err, 2 * naive_err + floor) << "error " << err << ", naive " << naive_err;
}

// One case of the option table in float32 against the float64 reference,
// with whole rows (vocab_chunk = 0) or vocabulary blocks of `vocab_chunk`
// classes.
void check_in_float32(const Case& c, Backend backend, std::int64_t vocab_chunk) {
  {
    const Inputs in = make_inputs(c);
    // keel in float32; the reference in float64 on the same rounded values.
    const at::Tensor h = in.hidden.to(at::kFloat).requires_grad_(true);
    const at::Tensor w = in.weight.to(at::kFloat).requires_grad_(true);
    LinearCrossEntropyOptions o = options_for_backend(c, in, at::kFloat, backend);
    o.vocab_chunk_size = vocab_chunk;
    if (o.bias.defined()) o.bias.requires_grad_(true);
    auto r = linear_cross_entropy(h, w, in.target, o);
    ASSERT_TRUE(r) << r.error().to_string();
    EXPECT_EQ(r.value().dispatch.served, Backend::compat);
    const at::Tensor loss = r.value().loss;
    ASSERT_EQ(loss.scalar_type(), at::kFloat);

    const at::Tensor h64 = h.detach().to(at::kDouble).requires_grad_(true);
    const at::Tensor w64 = w.detach().to(at::kDouble).requires_grad_(true);
    reference::LinearCrossEntropyCase rc = reference_case(c, in);
    if (o.bias.defined()) rc.bias = o.bias.detach().to(at::kDouble).requires_grad_(true);
    rc.class_weights = o.class_weights.defined() ? o.class_weights.to(at::kDouble) : at::Tensor();
    const auto ref = reference::linear_cross_entropy(h64, w64, in.target, rc);
    ASSERT_EQ(loss.sizes(), ref.loss.sizes());
    // The naive float32 computation on the same values (full logits).
    const at::Tensor hn = h.detach().clone().requires_grad_(true);
    const at::Tensor wn = w.detach().clone().requires_grad_(true);
    reference::LinearCrossEntropyCase nc = rc;
    if (o.bias.defined()) nc.bias = o.bias.detach().clone().requires_grad_(true);
    const auto naive = reference::linear_cross_entropy(hn, wn, in.target, nc, at::kFloat);
    {
      SCOPED_TRACE("loss");
      expect_within_naive(loss.detach(), naive.loss.detach(), ref.loss.detach());
    }

    // Random per-token upstream gradients for none; 1 otherwise.
    const at::Tensor upstream = at::randn({c.tokens}, at::kDouble);
    const variable_list got = gradients(loss, {h, w, o.bias}, upstream);
    const variable_list want = gradients(ref.loss, {h64, w64, rc.bias}, upstream);
    const variable_list same = gradients(naive.loss, {hn, wn, nc.bias}, upstream);
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(same.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(i == 0 ? "grad hidden" : i == 1 ? "grad weight" : "grad bias");
      EXPECT_EQ(got[i].scalar_type(), at::kFloat);
      expect_within_naive(got[i], same[i], want[i]);
    }
  }
}

TEST_P(LinearCrossEntropyConformance, ReferenceIsPyTorchsCrossEntropy) {
  // Pins the reference itself to at::cross_entropy_loss (what
  // F.cross_entropy calls) wherever PyTorch has the option.
  for (const Case& c : kTable) {
    if (c.z_loss > 0 || c.logit_softcap > 0) continue;
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c);
    const auto ref =
        reference::linear_cross_entropy(in.hidden, in.weight, in.target, reference_case(c, in));
    const at::Tensor logits = at::linear(in.hidden, in.weight, in.bias);
    const std::int64_t reduction = c.reduction == Reduction::mean  ? at::Reduction::Mean
                                   : c.reduction == Reduction::sum ? at::Reduction::Sum
                                                                   : at::Reduction::None;
    const at::Tensor torch_loss = at::cross_entropy_loss(
        logits, in.target, in.class_weights, reduction, c.ignore_index, c.label_smoothing);
    EXPECT_TRUE(at::allclose(ref.loss, torch_loss, 1e-12, 1e-12));
  }
}

TEST_P(LinearCrossEntropyConformance, HalfTypesAreWithinTheNaiveSamePrecisionError) {
  const Case c{{"mixed", Reduction::none, -100, 0.2, 0.1, true, true, 0, 0, 40, 300}, 16};
  const Inputs in = make_inputs(c);
  for (const auto& [dtype, slack] : {std::pair{at::kBFloat16, 1e-2}, std::pair{at::kHalf, 1e-3}}) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor h = in.hidden.to(dtype).requires_grad_(true);
    const at::Tensor w = in.weight.to(dtype).requires_grad_(true);
    LinearCrossEntropyOptions o = options_for(c, in, dtype);
    auto r = linear_cross_entropy(h, w, in.target, o);
    ASSERT_TRUE(r) << r.error().to_string();
    EXPECT_EQ(r.value().loss.scalar_type(), at::kFloat);

    const at::Tensor h64 = h.detach().to(at::kDouble).requires_grad_(true);
    reference::LinearCrossEntropyCase rc = reference_case(c, in);
    rc.bias = o.bias.to(at::kDouble);
    rc.class_weights = o.class_weights.to(at::kDouble);
    const auto ref = reference::linear_cross_entropy(h64, w.detach(), in.target, rc);

    // The naive computation PyTorch users run: F.linear in the half type,
    // then cross-entropy in float32.
    const at::Tensor hn = h.detach().clone().requires_grad_(true);
    const at::Tensor naive =
        at::cross_entropy_loss(at::linear(hn, w.detach(), o.bias).to(at::kFloat), in.target,
                               o.class_weights, at::Reduction::None, -100, c.label_smoothing);

    const at::Tensor got = r.value().loss.detach().to(at::kDouble);
    const at::Tensor bound = (naive.detach().to(at::kDouble) - ref.loss.detach()).abs() + slack;
    EXPECT_TRUE(((got - ref.loss.detach()).abs() <= bound).all().item<bool>());

    const at::Tensor upstream = at::randn({c.tokens}, at::kFloat);
    const at::Tensor g = torch::autograd::grad({r.value().loss}, {h}, {upstream})[0];
    const at::Tensor gn = torch::autograd::grad({naive}, {hn}, {upstream})[0];
    const at::Tensor g64 = torch::autograd::grad({ref.loss}, {h64}, {upstream.to(at::kDouble)})[0];
    const at::Tensor gbound = (gn.to(at::kDouble) - g64).abs() + slack;
    EXPECT_TRUE(((g.to(at::kDouble) - g64).abs() <= gbound).all().item<bool>());
  }
}

TEST_P(LinearCrossEntropyConformance, BatchedInputGivesTheFlattenedResultInTargetsShape) {
  const Case c{{"batched", Reduction::none, -100, 0.2, 0.0, false, false, 0, 0, 12, 30}, 5};
  const Inputs in = make_inputs(c);
  const at::Tensor h = in.hidden.to(at::kFloat);
  const at::Tensor w = in.weight.to(at::kFloat);
  LinearCrossEntropyOptions o = options_for(c, in, at::kFloat);
  o.return_lse = true;
  o.return_per_token_loss = true;
  auto flat = linear_cross_entropy(h, w, in.target, o);
  auto batched = linear_cross_entropy(h.view({3, 4, kDim}), w, in.target.view({3, 4}), o);
  ASSERT_TRUE(flat && batched);
  EXPECT_EQ(batched.value().loss.sizes(), (at::IntArrayRef{3, 4}));
  EXPECT_EQ(batched.value().lse.sizes(), (at::IntArrayRef{3, 4}));
  EXPECT_EQ(batched.value().per_token_loss.sizes(), (at::IntArrayRef{3, 4}));
  EXPECT_TRUE(at::equal(batched.value().loss.reshape({-1}), flat.value().loss));
}

TEST_P(LinearCrossEntropyConformance, ReturnsPerTokenLossAndLseThatAddUpToTheLoss) {
  const Case c{{"outputs", Reduction::mean, -100, 0.3, 0.1, true, true, 2.0, 1e-2, 25, 40}, 6};
  const Inputs in = make_inputs(c);
  LinearCrossEntropyOptions o = options_for(c, in, at::kDouble);
  o.class_weights = in.class_weights;
  o.return_lse = true;
  o.return_per_token_loss = true;
  auto r = linear_cross_entropy(in.hidden, in.weight, in.target, o);
  ASSERT_TRUE(r) << r.error().to_string();
  const auto ref =
      reference::linear_cross_entropy(in.hidden, in.weight, in.target, reference_case(c, in));
  EXPECT_TRUE(at::allclose(r.value().per_token_loss, ref.per_token, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(r.value().lse, ref.lse, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(r.value().loss, ref.loss, 1e-12, 1e-12));
  EXPECT_FALSE(r.value().lse.requires_grad());
}

TEST_P(LinearCrossEntropyConformance, NonContiguousAndExpandedInputs) {
  const Case c{{"strided", Reduction::sum, -100, 0.1, 0.1, false, true, 0, 0, 10, 26}, 3};
  const Inputs in = make_inputs(c);
  // hidden as a transpose, weight as a column slice, target as a stride-2
  // view, and an expanded (stride-0) hidden.
  const at::Tensor hidden_t = in.hidden.t().contiguous().t();
  const at::Tensor weight_wide = at::cat({in.weight, in.weight}, 1);
  const at::Tensor weight_view = weight_wide.narrow(1, 0, kDim);
  const at::Tensor target_wide = at::stack({in.target, in.target}, 1);
  const at::Tensor target_view = target_wide.select(1, 0);
  const at::Tensor hidden_expanded = in.hidden[0].expand({c.tokens, kDim});
  ASSERT_FALSE(hidden_t.is_contiguous() || weight_view.is_contiguous() ||
               target_view.is_contiguous());
  const LinearCrossEntropyOptions o = [&] {
    LinearCrossEntropyOptions x = options_for(c, in, at::kDouble);
    x.bias = in.bias;
    return x;
  }();
  for (const at::Tensor& h : {hidden_t, hidden_expanded}) {
    const at::Tensor leaf = h.detach().requires_grad_(true);
    auto r = linear_cross_entropy(leaf, weight_view, target_view, o);
    ASSERT_TRUE(r) << r.error().to_string();
    const at::Tensor h64 = h.detach().contiguous().requires_grad_(true);
    const auto ref =
        reference::linear_cross_entropy(h64, in.weight, in.target, reference_case(c, in));
    EXPECT_TRUE(at::allclose(r.value().loss, ref.loss, 1e-12, 1e-12));
    const at::Tensor g = torch::autograd::grad({r.value().loss}, {leaf})[0];
    const at::Tensor g64 = torch::autograd::grad({ref.loss}, {h64})[0];
    EXPECT_TRUE(at::allclose(g, g64, 1e-10, 1e-12));
  }
}

TEST_P(LinearCrossEntropyConformance, AllIgnoredMeanIsNanWithZeroGradients) {
  const Case c{{"all_ignored", Reduction::mean, -100, 1.0, 0.1, true, false, 0, 1e-2, 8, 20}, 3};
  const Inputs in = make_inputs(c);
  ASSERT_TRUE(in.target.eq(-100).all().item<bool>());
  const at::Tensor h = in.hidden.to(at::kFloat).requires_grad_(true);
  const at::Tensor w = in.weight.to(at::kFloat).requires_grad_(true);
  auto r = linear_cross_entropy(h, w, in.target, options_for(c, in, at::kFloat));
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_TRUE(std::isnan(r.value().loss.item<float>()));
  const variable_list g = torch::autograd::grad({r.value().loss}, {h, w});
  EXPECT_TRUE(g[0].eq(0).all().item<bool>());
  EXPECT_TRUE(g[1].eq(0).all().item<bool>());
}

// Found by tests/fuzz/loss_fuzz.cpp: a feature dimension of 0 made the
// flattening of [B, T, 0] ambiguous, and libtorch's exception escaped.
// Every logit is then the bias, so the loss is lse(bias) - bias[y].
TEST_P(LinearCrossEntropyConformance, ZeroFeatureDimensionGivesTheBiasOnlyLoss) {
  const at::Tensor hidden = at::zeros({2, 3, 0}, at::kDouble).requires_grad_(true);
  const at::Tensor weight = at::zeros({5, 0}, at::kDouble).requires_grad_(true);
  const at::Tensor target = at::tensor({0, 4, 2, 1, 3, 4}, at::kLong).view({2, 3});
  LinearCrossEntropyOptions o;
  o.bias = at::linspace(-1.0, 1.0, 5, at::kDouble);
  o.reduction = Reduction::none;
  o.dispatch.backend = GetParam();
  auto r = linear_cross_entropy(hidden, weight, target, o);
  ASSERT_TRUE(r) << r.error().to_string();
  const at::Tensor want =
      (o.bias.logsumexp(0) - o.bias.index_select(0, target.view({-1}))).view({2, 3});
  EXPECT_TRUE(at::allclose(r.value().loss, want, 1e-12, 1e-12)) << r.value().loss << want;
  r.value().loss.sum().backward();
  EXPECT_EQ(hidden.grad().sizes(), hidden.sizes());
  EXPECT_EQ(weight.grad().sizes(), weight.sizes());
}

TEST_P(LinearCrossEntropyConformance, FrozenWeightGetsNoGradient) {
  const Case c{{"frozen", Reduction::mean, -100, 0.2, 0.0, false, true, 0, 0, 12, 30}, 4};
  const Inputs in = make_inputs(c);
  const at::Tensor h = in.hidden.clone().requires_grad_(true);
  const at::Tensor w = in.weight.clone();  // frozen
  LinearCrossEntropyOptions o = options_for(c, in, at::kDouble);
  o.bias = in.bias.clone();  // frozen too
  auto r = linear_cross_entropy(h, w, in.target, o);
  ASSERT_TRUE(r) << r.error().to_string();
  r.value().loss.backward();
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(o.bias.grad().defined());
  const at::Tensor h64 = in.hidden.clone().requires_grad_(true);
  const auto ref = reference::linear_cross_entropy(h64, w, in.target, reference_case(c, in));
  ref.loss.backward();
  EXPECT_TRUE(at::allclose(h.grad(), h64.grad(), 1e-10, 1e-12));
}

TEST_P(LinearCrossEntropyConformance, NoGradModeBuildsNoGraph) {
  const Case c{{"no_grad", Reduction::mean, -100, 0.0, 0.0, false, false, 0, 0, 8, 20}, 3};
  const Inputs in = make_inputs(c);
  const at::Tensor h = in.hidden.clone().requires_grad_(true);
  const at::Tensor w = in.weight.clone().requires_grad_(true);
  at::NoGradGuard no_grad;
  auto r = linear_cross_entropy(h, w, in.target, options_for(c, in, at::kDouble));
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_FALSE(r.value().loss.requires_grad());
  EXPECT_FALSE(r.value().loss.grad_fn());
  const auto ref = reference::linear_cross_entropy(h, w, in.target, reference_case(c, in));
  EXPECT_TRUE(at::allclose(r.value().loss, ref.loss, 1e-12, 1e-12));
}

TEST_P(LinearCrossEntropyConformance, ChunkSizeDoesNotChangeTheResultAndRunsAreBitwiseEqual) {
  const Case base{{"chunks", Reduction::mean, -100, 0.2, 0.1, true, true, 2.0, 1e-2, 29, 43}, 0};
  const Inputs in = make_inputs(base);
  struct Run {
    at::Tensor loss, grad_hidden, grad_weight, grad_bias;
  };
  const auto run = [&](at::ScalarType dtype, std::int64_t chunk, std::int64_t vocab_chunk = 0) {
    const at::Tensor h = in.hidden.to(dtype).requires_grad_(true);
    const at::Tensor w = in.weight.to(dtype).requires_grad_(true);
    LinearCrossEntropyOptions o = options_for(base, in, dtype);
    o.bias.requires_grad_(true);
    o.chunk_size = chunk;
    o.vocab_chunk_size = vocab_chunk;
    auto r = linear_cross_entropy(h, w, in.target, o);
    EXPECT_TRUE(r) << r.error().to_string();
    const variable_list g = torch::autograd::grad({r.value().loss}, {h, w, o.bias});
    return Run{r.value().loss.detach(), g[0], g[1], g[2]};
  };
  const Run want = run(at::kDouble, 0);
  // Token chunks {1, 2, 3, 7, 13, N, > N, auto} times vocabulary blocks
  // {whole rows, 1, 2, 3, 7, 13, V - 1, V}: 43 classes are a multiple of none.
  for (std::int64_t chunk : {1, 2, 3, 7, 13, 29, 100, 0}) {
    for (std::int64_t vocab_chunk : {0, 1, 2, 3, 7, 13, 42, 43}) {
      SCOPED_TRACE(::testing::Message() << "chunk " << chunk << ", vocab chunk " << vocab_chunk);
      const Run got = run(at::kDouble, chunk, vocab_chunk);
      EXPECT_TRUE(at::allclose(got.loss, want.loss, 1e-13, 1e-13));
      EXPECT_TRUE(at::allclose(got.grad_hidden, want.grad_hidden, 1e-12, 1e-14));
      EXPECT_TRUE(at::allclose(got.grad_weight, want.grad_weight, 1e-12, 1e-14));
      EXPECT_TRUE(at::allclose(got.grad_bias, want.grad_bias, 1e-12, 1e-14));
    }
  }
  // And the automatic size against the float64 reference itself.
  const at::Tensor h64 = in.hidden.clone().requires_grad_(true);
  const at::Tensor w64 = in.weight.clone().requires_grad_(true);
  reference::LinearCrossEntropyCase rc = reference_case(base, in);
  rc.bias = in.bias.clone().requires_grad_(true);
  rc.class_weights = in.class_weights.to(at::kFloat).to(at::kDouble);
  const auto ref = reference::linear_cross_entropy(h64, w64, in.target, rc);
  const variable_list ref_grads = torch::autograd::grad({ref.loss}, {h64, w64, rc.bias});
  EXPECT_TRUE(at::allclose(want.loss, ref.loss.detach(), 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(want.grad_hidden, ref_grads[0], 1e-10, 1e-12));
  EXPECT_TRUE(at::allclose(want.grad_weight, ref_grads[1], 1e-10, 1e-12));
  EXPECT_TRUE(at::allclose(want.grad_bias, ref_grads[2], 1e-10, 1e-12));
  for (const auto& [chunk, vocab_chunk] :
       {std::pair{1, 0}, std::pair{7, 0}, std::pair{0, 0}, std::pair{3, 5}, std::pair{0, 8}}) {
    SCOPED_TRACE(::testing::Message() << "chunk " << chunk << ", vocab chunk " << vocab_chunk);
    const Run a = run(at::kFloat, chunk, vocab_chunk);
    const Run b = run(at::kFloat, chunk, vocab_chunk);
    EXPECT_TRUE(at::equal(a.loss, b.loss));
    EXPECT_TRUE(at::equal(a.grad_hidden, b.grad_hidden));
    EXPECT_TRUE(at::equal(a.grad_weight, b.grad_weight));
    EXPECT_TRUE(at::equal(a.grad_bias, b.grad_bias));
  }
}

// Restores ATen's intra-op thread count when a test ends.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : saved_(at::get_num_threads()) {}
  ~ThreadCountGuard() { at::set_num_threads(saved_); }
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

 private:
  int saved_;
};

TEST_P(LinearCrossEntropyConformance, ResultsAreBitwiseRepeatableAtEachThreadCount) {
  // Large enough that ATen splits its elementwise ops and reductions across
  // threads (blocks of more than 32768 elements), for whole rows, vocabulary
  // blocks, one-token chunks (a single-row reduction over V > 32768) and
  // reduction none; plus a per-token sum over more than 32768 tokens.
  // At a given thread count every run is bitwise the same. Across thread
  // counts keel's own reductions are ordered, but the gradient GEMMs are the
  // BLAS library's: MKL splits a long inner dimension (the vocabulary for
  // grad_hidden, the tokens for grad_weight) across threads when the output
  // is small beside it, and rounds differently with 1 and 2 threads (seen on
  // an AVX-512 machine for inner dimensions >= 1024, any output row count;
  // an ATen parallel region does not make it sequential either). So across
  // thread counts the results agree to float32 rounding of those sums:
  // 1e-5 of the largest entry, about 10 float32 epsilons times log2(V).
  struct Plan {
    const char* name;
    Reduction reduction;
    std::int64_t tokens, vocab, chunk, vocab_chunk;
  };
  const Plan plans[] = {
      {"whole_rows", Reduction::mean, 96, 3001, 24, 0},
      {"vocab_blocks", Reduction::sum, 96, 3001, 40, 1000},
      {"none_recomputed", Reduction::none, 96, 3001, 24, 0},
      {"one_token_chunks", Reduction::mean, 3, 40000, 1, 0},
      {"many_tokens", Reduction::mean, 33000, 257, 0, 0},
  };
  const ThreadCountGuard restore;
  for (const Plan& plan : plans) {
    SCOPED_TRACE(plan.name);
    const Case c{
        {plan.name, plan.reduction, -100, 0.1, 0.1, true, true, 2.0, 1e-3, plan.tokens, plan.vocab},
        plan.chunk};
    const Inputs in = make_inputs(c, /*dim=*/128);
    const at::Tensor upstream = at::randn({c.tokens}, at::kFloat);
    const auto run = [&](int threads) {
      at::set_num_threads(threads);
      const at::Tensor h = in.hidden.to(at::kFloat).requires_grad_(true);
      const at::Tensor w = in.weight.to(at::kFloat).requires_grad_(true);
      LinearCrossEntropyOptions o = options_for(c, in, at::kFloat);
      o.vocab_chunk_size = plan.vocab_chunk;
      o.bias.requires_grad_(true);
      auto r = linear_cross_entropy(h, w, in.target, o);
      EXPECT_TRUE(r) << r.error().to_string();
      variable_list out = gradients(r.value().loss, {h, w, o.bias}, upstream);
      out.push_back(r.value().loss.detach());
      return out;
    };
    const variable_list one = run(1);
    const variable_list one_again = run(1);
    const variable_list two = run(2);
    const variable_list two_again = run(2);
    ASSERT_EQ(one.size(), two.size());
    for (size_t i = 0; i < one.size(); ++i) {
      SCOPED_TRACE(i);
      EXPECT_TRUE(at::equal(one[i], one_again[i]));
      EXPECT_TRUE(at::equal(two[i], two_again[i]));
      const double scale = std::max(one[i].abs().max().item<double>(), 1e-30);
      EXPECT_LE((one[i] - two[i]).abs().max().item<double>() / scale, 1e-5);
    }
  }
}

// The automatic working-set budget is an eighth of the gradients' size
// ((N + V) * D float32 elements), at least 8 MiB: measured as the peak of
// forward+backward above the gradients themselves, by the harness's
// counting allocator. At N=256, D=1024, V=32768 an eighth is 16.1 MiB (the
// 8 MiB floor would give half the rows); at V=4096 the floor applies.
TEST_P(LinearCrossEntropyConformance, AutomaticBudgetIsAnEighthOfTheGradientsAndAtLeast8MiB) {
  constexpr double kMiB = 1 << 20;
  for (const std::int64_t vocab : {std::int64_t{32768}, std::int64_t{4096}}) {
    SCOPED_TRACE(vocab);
    const std::int64_t n = 256;
    const std::int64_t d = 1024;
    at::manual_seed(0);
    const at::Tensor h = at::randn({n, d}).requires_grad_(true);
    const at::Tensor w = (at::randn({vocab, d}) * 0.05).requires_grad_(true);
    const at::Tensor y = at::randint(0, vocab, {n}, at::kLong);
    LinearCrossEntropyOptions o;
    o.dispatch.backend = GetParam();
    double peak = 0;
    {
      const harness::PeakMemory memory;
      auto r = linear_cross_entropy(h, w, y, o);
      ASSERT_TRUE(r) << r.error().to_string();
      r.value().loss.backward();
      peak = static_cast<double>(memory.peak_bytes());
    }
    const double gradients = 4.0 * static_cast<double>((n + vocab) * d);
    const double budget = std::max(8 * kMiB, gradients / 8);
    const double working_set = peak - gradients;
    // The block is whole rows of V float32 within the budget; per-token
    // vectors and the loss add a few KiB.
    const double row = 4.0 * static_cast<double>(vocab);
    const double rows = std::min(static_cast<double>(n), std::floor(budget / row));
    EXPECT_LE(working_set, budget + 64 * 1024) << working_set / kMiB << " MiB";
    EXPECT_GE(working_set, rows * row) << working_set / kMiB << " MiB";
  }
}

TEST_P(LinearCrossEntropyConformance, TightBudgetUsesVocabularyBlocksAndMatchesTheReference) {
  // A 4 KiB budget holds fewer than 32 rows of 300 float32 classes, so the
  // automatic plan cuts the vocabulary into blocks and recomputes in
  // backward, which (unlike whole rows) lets a reduced loss backpropagate
  // twice.
  const Case c{{"tight", Reduction::mean, -100, 0.2, 0.1, true, true, 0, 1e-2, 40, 300}, 0};
  const Inputs in = make_inputs(c);
  const at::Tensor h = in.hidden.to(at::kFloat).requires_grad_(true);
  const at::Tensor w = in.weight.to(at::kFloat).requires_grad_(true);
  LinearCrossEntropyOptions o = options_for(c, in, at::kFloat);
  o.chunk_budget_bytes = 4096;
  auto r = linear_cross_entropy(h, w, in.target, o);
  ASSERT_TRUE(r) << r.error().to_string();
  const at::Tensor h64 = h.detach().to(at::kDouble).requires_grad_(true);
  const at::Tensor w64 = w.detach().to(at::kDouble).requires_grad_(true);
  reference::LinearCrossEntropyCase rc = reference_case(c, in);
  rc.bias = o.bias.to(at::kDouble);
  rc.class_weights = o.class_weights.to(at::kDouble);
  const auto ref = reference::linear_cross_entropy(h64, w64, in.target, rc);
  EXPECT_LE(max_relative_error(r.value().loss.detach(), ref.loss.detach()), 1e-5);
  const variable_list first = torch::autograd::grad({r.value().loss}, {h, w}, {}, true);
  const variable_list second = torch::autograd::grad({r.value().loss}, {h, w});
  const variable_list want = torch::autograd::grad({ref.loss}, {h64, w64});
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(at::allclose(first[i].to(at::kDouble), want[i], 5e-4, 1e-5));
    EXPECT_TRUE(at::equal(first[i], second[i]));
  }
}

TEST_P(LinearCrossEntropyConformance, AccumulationDtypeOption) {
  const Case c{{"accumulation", Reduction::none, -100, 0.2, 0.1, true, true, 2.0, 1e-2, 30, 200},
               8};
  const Inputs in = make_inputs(c);
  const at::Tensor upstream = at::randn({c.tokens}, at::kDouble);
  reference::LinearCrossEntropyCase rc = reference_case(c, in);
  rc.class_weights = in.class_weights.to(at::kFloat).to(at::kDouble);

  // float32 input accumulated in float64: the loss comes back in float64
  // and only the float32 GEMM separates it from the reference, which sees
  // the same float32 logits rounded from float64.
  {
    const at::Tensor h = in.hidden.to(at::kFloat).requires_grad_(true);
    const at::Tensor w = in.weight.to(at::kFloat).requires_grad_(true);
    LinearCrossEntropyOptions o = options_for(c, in, at::kFloat);
    o.accumulation_dtype = at::kDouble;
    auto r = linear_cross_entropy(h, w, in.target, o);
    ASSERT_TRUE(r) << r.error().to_string();
    EXPECT_EQ(r.value().loss.scalar_type(), at::kDouble);
    LinearCrossEntropyOptions f = options_for(c, in, at::kFloat);
    auto r32 = linear_cross_entropy(h, w, in.target, f);
    ASSERT_TRUE(r32) << r32.error().to_string();
    EXPECT_EQ(r32.value().loss.scalar_type(), at::kFloat);

    const at::Tensor h64 = h.detach().to(at::kDouble).requires_grad_(true);
    const at::Tensor w64 = w.detach().to(at::kDouble).requires_grad_(true);
    rc.bias = o.bias.to(at::kDouble);
    const auto ref = reference::linear_cross_entropy(h64, w64, in.target, rc);
    EXPECT_LE(max_relative_error(r.value().loss.detach(), ref.loss.detach()), 1e-5);
    // Accumulating in float64 is at least as close as in float32.
    const double err64 = max_relative_error(r.value().loss.detach(), ref.loss.detach());
    const double err32 = max_relative_error(r32.value().loss.detach(), ref.loss.detach());
    EXPECT_LE(err64, err32 * 1.01 + 1e-9);
    const variable_list got = torch::autograd::grad({r.value().loss}, {h, w}, {upstream});
    const variable_list want = torch::autograd::grad({ref.loss}, {h64, w64}, {upstream});
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].scalar_type(), at::kFloat);
      EXPECT_TRUE(at::allclose(got[i].to(at::kDouble), want[i], 5e-4, 1e-5));
    }
  }
  // bfloat16 input: Float is the default, bitwise; Double stays within the
  // error of the naive float32 upcast (F.linear in bfloat16, then
  // cross-entropy in float32) plus the bfloat16 slack.
  {
    const Case b{{"bf16", Reduction::none, -100, 0.2, 0.1, true, true, 0, 0, 30, 200}, 8};
    const Inputs bin = make_inputs(b);
    const at::Tensor h = bin.hidden.to(at::kBFloat16);
    const at::Tensor w = bin.weight.to(at::kBFloat16);
    LinearCrossEntropyOptions o = options_for(b, bin, at::kBFloat16);
    auto by_default = linear_cross_entropy(h, w, bin.target, o);
    o.accumulation_dtype = at::kFloat;
    auto as_float = linear_cross_entropy(h, w, bin.target, o);
    o.accumulation_dtype = at::kDouble;
    auto as_double = linear_cross_entropy(h, w, bin.target, o);
    ASSERT_TRUE(by_default && as_float && as_double);
    EXPECT_TRUE(at::equal(by_default.value().loss, as_float.value().loss));
    EXPECT_EQ(as_double.value().loss.scalar_type(), at::kDouble);
    reference::LinearCrossEntropyCase brc = reference_case(b, bin);
    brc.bias = o.bias.to(at::kDouble);
    brc.class_weights = o.class_weights.to(at::kDouble);
    const auto ref =
        reference::linear_cross_entropy(h.to(at::kDouble), w.to(at::kDouble), bin.target, brc);
    const at::Tensor naive =
        at::cross_entropy_loss(at::linear(h, w, o.bias).to(at::kFloat), bin.target, o.class_weights,
                               at::Reduction::None, -100, b.label_smoothing);
    const at::Tensor bound = (naive.to(at::kDouble) - ref.loss).abs() + 1e-2;
    EXPECT_TRUE(((as_double.value().loss - ref.loss).abs() <= bound).all().item<bool>());
  }
}

TEST_P(LinearCrossEntropyConformance, GradientMatchesFiniteDifferencesInFloat64) {
  const Case c{{"fd", Reduction::mean, -100, 0.2, 0.1, true, true, 1.5, 1e-2, 5, 9}, 2};
  const Inputs in = make_inputs(c);
  LinearCrossEntropyOptions o = options_for(c, in, at::kDouble);
  o.class_weights = in.class_weights;
  const auto loss_at = [&](const at::Tensor& h, const at::Tensor& w) {
    return linear_cross_entropy(h, w, in.target, o).value().loss;
  };
  const at::Tensor h = in.hidden.clone().requires_grad_(true);
  const at::Tensor w = in.weight.clone().requires_grad_(true);
  const variable_list g = torch::autograd::grad({loss_at(h, w)}, {h, w});
  constexpr double eps = 1e-6;
  for (const auto& [row, col] : {std::pair{0, 0}, std::pair{2, 5}, std::pair{4, 23}}) {
    at::Tensor hp = in.hidden.clone();
    at::Tensor hm = in.hidden.clone();
    hp[row][col] += eps;
    hm[row][col] -= eps;
    const double fd = (loss_at(hp, in.weight) - loss_at(hm, in.weight)).item<double>() / (2 * eps);
    EXPECT_NEAR(g[0][row][col].item<double>(), fd, 1e-7);
    at::Tensor wp = in.weight.clone();
    at::Tensor wm = in.weight.clone();
    wp[row][col] += eps;
    wm[row][col] -= eps;
    const double fdw = (loss_at(in.hidden, wp) - loss_at(in.hidden, wm)).item<double>() / (2 * eps);
    EXPECT_NEAR(g[1][row][col].item<double>(), fdw, 1e-7);
  }
}

TEST_P(LinearCrossEntropyConformance, SecondOrderGradientIsAClearError) {
  const Case c{{"double_backward", Reduction::sum, -100, 0.0, 0.0, false, false, 0, 0, 6, 10}, 2};
  const Inputs in = make_inputs(c);
  const at::Tensor h = in.hidden.clone().requires_grad_(true);
  const at::Tensor w = in.weight.clone().requires_grad_(true);
  auto r = linear_cross_entropy(h, w, in.target, options_for(c, in, at::kDouble));
  ASSERT_TRUE(r) << r.error().to_string();
  try {
    torch::autograd::grad({r.value().loss}, {h}, {}, /*retain_graph=*/true,
                          /*create_graph=*/true);
    ADD_FAILURE() << "create_graph=true did not fail";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("second-order"), std::string::npos) << e.what();
  }
}

TEST_P(LinearCrossEntropyConformance, BackwardTwiceThroughOneReducedLossIsAClearError) {
  const Case c{{"twice", Reduction::mean, -100, 0.0, 0.0, false, false, 0, 0, 6, 10}, 2};
  const Inputs in = make_inputs(c);
  const at::Tensor h = in.hidden.clone().requires_grad_(true);
  auto r = linear_cross_entropy(h, in.weight, in.target, options_for(c, in, at::kDouble));
  ASSERT_TRUE(r) << r.error().to_string();
  r.value().loss.backward({}, /*retain_graph=*/true);
  try {
    r.value().loss.backward();
    ADD_FAILURE() << "a second backward did not fail";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("backward ran twice"), std::string::npos) << e.what();
  }
}

TEST_P(LinearCrossEntropyConformance, TokensTimesVocabAbove2To31UsesWideIndexing) {
  // N * V = 65600 * 32769 > 2^31. With hidden = 0 every token's logits are
  // the bias, so the per-token loss is lse(bias) - bias[y], cheap to check
  // for every token without the [N, V] reference.
  constexpr std::int64_t kTokens = 65600;
  constexpr std::int64_t kVocab = 32769;
  static_assert(kTokens * kVocab > (std::int64_t{1} << 31));
  at::NoGradGuard no_grad;
  const at::Tensor h = at::zeros({kTokens, 1});
  const at::Tensor w = at::randn({kVocab, 1});
  const at::Tensor y = at::randint(0, kVocab, {kTokens}, at::kLong);
  LinearCrossEntropyOptions o;
  o.bias = at::randn({kVocab});
  o.reduction = Reduction::none;
  o.dispatch.backend = GetParam();
  auto r = linear_cross_entropy(h, w, y, o);
  ASSERT_TRUE(r) << r.error().to_string();
  const at::Tensor b = o.bias.to(at::kDouble);
  const at::Tensor want = at::logsumexp(b, 0) - b.index_select(0, y);
  EXPECT_TRUE(at::allclose(r.value().loss.to(at::kDouble), want, 1e-5, 1e-5));
}

TEST_P(LinearCrossEntropyConformance, ReductionNoneRecomputesSoItCanBackpropagateTwice) {
  const Case c{{"none_twice", Reduction::none, -100, 0.2, 0.1, false, false, 0, 0, 9, 14}, 4};
  const Inputs in = make_inputs(c);
  const at::Tensor h = in.hidden.clone().requires_grad_(true);
  auto r = linear_cross_entropy(h, in.weight, in.target, options_for(c, in, at::kDouble));
  ASSERT_TRUE(r) << r.error().to_string();
  const at::Tensor upstream = at::randn({c.tokens}, at::kDouble);
  const at::Tensor first = torch::autograd::grad({r.value().loss}, {h}, {upstream}, true)[0];
  const at::Tensor second = torch::autograd::grad({r.value().loss}, {h}, {upstream})[0];
  EXPECT_TRUE(at::equal(first, second));
}

TEST_P(LinearCrossEntropyConformance, BadInputIsInvalidArgumentNamingTheArgument) {
  const at::Tensor h = at::randn({4, 8});
  const at::Tensor w = at::randn({10, 8});
  const at::Tensor y = at::randint(0, 10, {4}, at::kLong);
  struct BadCase {
    const char* what;
    at::Tensor hidden, weight, target;
    LinearCrossEntropyOptions options;
    const char* names;
  };
  const auto with = [](auto&& set) {
    LinearCrossEntropyOptions o;
    set(o);
    return o;
  };
  const at::Tensor y_out = y.clone().index_fill_(0, at::zeros({1}, at::kLong), 10);
  const at::Tensor y_neg = y.clone().index_fill_(0, at::zeros({1}, at::kLong), -1);
  const std::vector<BadCase> cases = {
      {"undefined hidden", at::Tensor(), w, y, {}, "hidden is an undefined"},
      {"undefined weight", h, at::Tensor(), y, {}, "weight is an undefined"},
      {"undefined target", h, w, at::Tensor(), {}, "target is an undefined"},
      {"int hidden", h.to(at::kInt), w, y, {}, "hidden has dtype"},
      {"dtype mismatch", h, w.to(at::kDouble), y, {}, "weight has dtype"},
      {"float target", h, w, y.to(at::kFloat), {}, "target has dtype"},
      {"int32 target", h, w, y.to(at::kInt), {}, "target has dtype"},
      {"D mismatch", h, at::randn({10, 9}), y, {}, "weight has 9 columns but hidden has 8"},
      {"1-d hidden", at::randn({8}), w, y, {}, "hidden has shape"},
      {"3-d weight", h, at::randn({10, 8, 1}), y, {}, "weight has shape"},
      {"target shape", h, w, y.narrow(0, 0, 3), {}, "target has shape [3]"},
      {"target above V", h, w, y_out, {}, "target holds 10, outside [0, 10)"},
      {"target negative", h, w, y_neg, {}, "target holds -1"},
      {"smoothing > 1", h, w, y, with([](auto& o) { o.label_smoothing = 1.5; }),
       "options.label_smoothing"},
      {"smoothing NaN", h, w, y,
       with([](auto& o) { o.label_smoothing = std::numeric_limits<double>::quiet_NaN(); }),
       "options.label_smoothing"},
      {"negative chunk", h, w, y, with([](auto& o) { o.chunk_size = -1; }), "options.chunk_size"},
      {"class weights length", h, w, y, with([](auto& o) { o.class_weights = at::ones({9}); }),
       "options.class_weights has shape [9]"},
      {"class weights dtype", h, w, y,
       with([](auto& o) { o.class_weights = at::ones({10}, at::kLong); }),
       "options.class_weights has dtype"},
      {"bias shape", h, w, y, with([](auto& o) {
         o.bias = at::zeros({10, 1});
       }),
       "options.bias has shape"},
      {"bias dtype", h, w, y, with([](auto& o) { o.bias = at::zeros({10}, at::kDouble); }),
       "options.bias has dtype"},
      {"negative z-loss", h, w, y, with([](auto& o) { o.z_loss = -1; }), "options.z_loss"},
      {"negative softcap", h, w, y, with([](auto& o) { o.logit_softcap = -2; }),
       "options.logit_softcap"},
      {"negative vocab chunk", h, w, y, with([](auto& o) { o.vocab_chunk_size = -3; }),
       "options.vocab_chunk_size"},
      {"negative budget", h, w, y, with([](auto& o) { o.chunk_budget_bytes = -1; }),
       "options.chunk_budget_bytes"},
      {"half accumulation", h, w, y, with([](auto& o) { o.accumulation_dtype = at::kHalf; }),
       "options.accumulation_dtype is Half"},
      {"integer accumulation", h, w, y, with([](auto& o) { o.accumulation_dtype = at::kLong; }),
       "options.accumulation_dtype is Long"},
      {"float accumulation of double", h.to(at::kDouble), w.to(at::kDouble), y,
       with([](auto& o) { o.accumulation_dtype = at::kFloat; }),
       "options.accumulation_dtype is Float but hidden is Double"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    LinearCrossEntropyOptions o = c.options;
    o.dispatch.backend = GetParam();
    auto r = linear_cross_entropy(c.hidden, c.weight, c.target, o);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Errc::invalid_argument);
    EXPECT_NE(r.error().message().find(c.names), std::string::npos) << r.error().message();
    EXPECT_EQ(r.error().message().rfind("linear_cross_entropy: ", 0), 0u) << r.error().message();
  }
}

// float32 gradients at a large token count, where the loss runs thousands
// of chunks (N = 131072 tokens in chunks of 64, D = 4, sum reduction, as in
// issue 19): grad_weight, grad_hidden and grad_bias, each as its worst error
// relative to its largest float64 entry, within twice that of the naive
// float32 loss (at::linear, then at::cross_entropy_loss through autograd).
TEST_P(LinearCrossEntropyConformance, Float32GradientsAtManyChunksWithinTwiceTheNaiveError) {
  at::manual_seed(19);
  constexpr std::int64_t kTokens = 131072;
  constexpr std::int64_t kFeatures = 4;
  constexpr std::int64_t kVocab = 257;
  const at::Tensor h64 = at::randn({kTokens, kFeatures}, at::kDouble);
  const at::Tensor w64 = at::randn({kVocab, kFeatures}, at::kDouble);
  const at::Tensor b64 = at::randn({kVocab}, at::kDouble);
  const at::Tensor target = at::randint(0, kVocab, {kTokens}, at::kLong);
  // The float32 inputs, and float64 copies of exactly those values.
  const auto leaf = [](const at::Tensor& t, at::ScalarType dtype) {
    return t.to(at::kFloat).to(dtype).requires_grad_(true);
  };
  const auto by_aten = [&](at::ScalarType dtype) {
    const at::Tensor h = leaf(h64, dtype), w = leaf(w64, dtype), b = leaf(b64, dtype);
    const at::Tensor loss =
        at::cross_entropy_loss(at::linear(h, w, b), target, {}, at::Reduction::Sum);
    return torch::autograd::grad({loss}, {h, w, b});
  };
  const variable_list want = by_aten(at::kDouble);
  const variable_list naive = by_aten(at::kFloat);
  const at::Tensor h = leaf(h64, at::kFloat), w = leaf(w64, at::kFloat), b = leaf(b64, at::kFloat);
  LinearCrossEntropyOptions o;
  o.reduction = Reduction::sum;
  o.bias = b;
  o.chunk_size = 64;
  o.dispatch.backend = GetParam();
  auto r = linear_cross_entropy(h, w, target, o);
  ASSERT_TRUE(r) << r.error().to_string();
  const variable_list got = torch::autograd::grad({r.value().loss}, {h, w, b});
  const auto relative = [](const at::Tensor& x, const at::Tensor& ref) {
    return (x.to(at::kDouble) - ref).abs().max().item<double>() / ref.abs().max().item<double>();
  };
  const char* names[] = {"grad_hidden", "grad_weight", "grad_bias"};
  for (int i = 0; i < 3; ++i) {
    const double mine = relative(got[i], want[i]);
    const double theirs = relative(naive[i], want[i]);
    EXPECT_LE(mine, 2 * theirs) << names[i] << ": keel " << mine << ", naive float32 " << theirs;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAdapter, LinearCrossEntropyConformance,
                         ::testing::ValuesIn(testing::adapters_in_build()), testing::adapter_name);

// One named case of the option table per test, on every adapter (native
// declines the loss: LinearCrossEntropyDispatch pins that, so it skips).
class LossOptionConformance : public ::testing::TestWithParam<std::tuple<Backend, std::string>> {
 protected:
  void SetUp() override {
    at::manual_seed(testing::kSeed);
    if (adapter() == Backend::native) GTEST_SKIP() << "native declines linear_cross_entropy";
  }
  Backend adapter() const { return std::get<0>(GetParam()); }
  const Case& the_case() const {
    for (const Case& c : kTable) {
      if (c.name == std::get<1>(GetParam())) return c;
    }
    throw std::logic_error("no case named " + std::get<1>(GetParam()));
  }
};

TEST_P(LossOptionConformance, MatchesFloat64ReferenceInFloat32) {
  check_in_float32(the_case(), adapter(), 0);
}

TEST_P(LossOptionConformance, VocabularyBlocksMatchFloat64ReferenceInFloat32) {
  // Blocks of 1, 5 and 16 classes: V is never a multiple, and the target
  // falls in every block position.
  for (std::int64_t vocab_chunk : {1, 5, 16}) {
    SCOPED_TRACE(vocab_chunk);
    check_in_float32(the_case(), adapter(), vocab_chunk);
  }
}

std::vector<std::string> table_names() {
  std::vector<std::string> names;
  for (const Case& c : kTable) names.emplace_back(c.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(
    EveryAdapter, LossOptionConformance,
    ::testing::Combine(::testing::ValuesIn(testing::adapters_in_build()),
                       ::testing::ValuesIn(table_names())),
    [](const ::testing::TestParamInfo<std::tuple<Backend, std::string>>& info) {
      return std::string(to_string(std::get<0>(info.param))) + "_" + std::get<1>(info.param);
    });

// Dispatch: native declines with the reason, auto records it and runs
// compat, and an explicit native request is unsupported (never a silent
// fallback).
TEST(LinearCrossEntropyDispatch, NativeDeclinesWithTheReasonAndAutoRunsCompat) {
  const at::Tensor h = at::randn({4, 8});
  const at::Tensor w = at::randn({10, 8});
  const at::Tensor y = at::randint(0, 10, {4}, at::kLong);
  LinearCrossEntropyOptions o;
  o.dispatch.backend = Backend::automatic;
  auto automatic = linear_cross_entropy(h, w, y, o);
  ASSERT_TRUE(automatic) << automatic.error().to_string();
  EXPECT_EQ(automatic.value().dispatch.served, Backend::compat);
  o.dispatch.backend = Backend::native;
  auto native = linear_cross_entropy(h, w, y, o);
  ASSERT_FALSE(native);
  EXPECT_EQ(native.error().code(), Errc::unsupported);
  if (KEEL_TEST_EXPECT_NATIVE) {
    EXPECT_NE(automatic.value().dispatch.reason.find(kNativeReason), std::string::npos)
        << automatic.value().dispatch.reason;
    EXPECT_NE(native.error().message().find(kNativeReason), std::string::npos)
        << native.error().message();
  } else {
    EXPECT_NE(native.error().message().find("no native adapter"), std::string::npos)
        << native.error().message();
  }
}

}  // namespace
}  // namespace keel
