// attention on every adapter of this build against the float64 reference.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "conformance/adapters.h"
#include "conformance/attention_support.h"
#include "reference/attention_reference.h"

namespace keel {
namespace {

using namespace attention_suite;  // NOLINT(google-build-using-namespace): the suite's own helpers

constexpr double kInf = std::numeric_limits<double>::infinity();

// A named spec builder for the mask-kind tables, given the call's shape.
struct MaskCase {
  const char* name;
  std::function<AttentionSpec(const Shape&)> spec;
};

// A block mask in FlexAttention's layout listing a pseudo-random set of key
// blocks per query block (with padding slots past the count), and, when
// `full`, a separate full-block list.
BlockMask random_block_mask(const Shape& s, std::int64_t block, bool full) {
  const std::int64_t qb = (s.Lq + block - 1) / block;
  const std::int64_t kvb = (s.Lk + block - 1) / block;
  BlockMask bm;
  bm.q_block_size = block;
  bm.kv_block_size = block;
  at::Tensor idx = at::zeros({s.B, s.Hq, qb, kvb}, at::kInt);
  at::Tensor cnt = at::zeros({s.B, s.Hq, qb}, at::kInt);
  at::Tensor fidx = at::zeros({s.B, s.Hq, qb, kvb}, at::kInt);
  at::Tensor fcnt = at::zeros({s.B, s.Hq, qb}, at::kInt);
  for (std::int64_t b = 0; b < s.B; ++b) {
    for (std::int64_t h = 0; h < s.Hq; ++h) {
      for (std::int64_t r = 0; r < qb; ++r) {
        int n = 0, f = 0;
        for (std::int64_t c = 0; c < kvb; ++c) {
          const std::int64_t pick = (b * 7 + h * 3 + r * 5 + c * 11) % 4;
          if (pick == 0) idx[b][h][r][n++] = static_cast<int>(c);
          if (pick == 1 && full) fidx[b][h][r][f++] = static_cast<int>(c);
        }
        cnt[b][h][r] = n;
        fcnt[b][h][r] = f;
      }
    }
  }
  bm.kv_num_blocks = cnt;
  bm.kv_indices = idx;
  if (full) {
    bm.full_kv_num_blocks = fcnt;
    bm.full_kv_indices = fidx;
  }
  return bm;
}

// Every mask kind, some compositions, both alignments.
std::vector<MaskCase> mask_cases() {
  return {
      {"none", [](const Shape&) { return AttentionSpec{}; }},
      {"causal_top_left", [](const Shape&) { return with_masks({Mask::causal()}); }},
      {"causal_bottom_right",
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
      {"sliding_window", [](const Shape&) { return with_masks({Mask::sliding_window(40, 0)}); }},
      {"sliding_window_two_sided",
       [](const Shape&) {
         return with_masks({Mask::sliding_window(17, 30, CausalAlignment::bottom_right)});
       }},
      {"chunked_causal", [](const Shape&) { return with_masks({Mask::chunked_causal(48)}); }},
      {"prefix_lm",
       [](const Shape& s) {
         return with_masks({Mask::prefix_lm(at::arange(s.B, at::kLong) * 37 + 20)});
       }},
      {"document",
       [](const Shape& s) {
         const at::Tensor q_ids = at::arange(s.Lq, at::kLong).floor_divide(60).repeat({s.B, 1});
         const at::Tensor k_ids = at::arange(s.Lk, at::kLong).floor_divide(60).repeat({s.B, 1});
         return with_masks({Mask::document(q_ids, k_ids)});
       }},
      {"key_padding",
       [](const Shape& s) {
         return with_masks(
             {Mask::key_padding((s.Lk - at::arange(s.B, at::kLong) * 50).clamp_min(0))});
       }},
      {"block_mask",
       [](const Shape& s) {
         return with_masks({Mask::block_mask(random_block_mask(s, 64, false))});
       }},
      {"block_mask_with_full_blocks",
       [](const Shape& s) {
         return with_masks({Mask::block_mask(random_block_mask(s, 64, true))});
       }},
      {"bool_tensor",
       [](const Shape& s) {
         return with_masks({Mask::from_tensor(at::rand({s.B, 1, s.Lq, s.Lk}) > 0.3)});
       }},
      {"causal_and_document",
       [](const Shape& s) {
         const at::Tensor q_ids = at::arange(s.Lq, at::kLong).floor_divide(70).repeat({s.B, 1});
         const at::Tensor k_ids = at::arange(s.Lk, at::kLong).floor_divide(70).repeat({s.B, 1});
         return with_masks({Mask::causal(), Mask::document(q_ids, k_ids)});
       }},
      {"window_or_prefix",
       [](const Shape& s) {
         return with_masks(
             {Mask::sliding_window(10, 0), Mask::prefix_lm(at::full({s.B}, 16, at::kLong))},
             MaskCombine::any_of);
       }},
      {"window_and_padding_and_block", [](const Shape& s) {
         return with_masks(
             {Mask::sliding_window(64, 64),
              Mask::key_padding(at::full({s.B}, std::max<std::int64_t>(s.Lk - 13, 0), at::kLong)),
              Mask::block_mask(random_block_mask(s, 32, true))});
       }}};
}

// The mask case named `name` (the cases are built once: their specs are
// functions of the shape, so sharing them is safe).
const MaskCase& mask_named(const std::string& name) {
  static const std::vector<MaskCase> cases = mask_cases();
  return case_named(cases, name);
}

// keel on `adapter`, which must serve the call; its output.
AttentionOutput run_on(Backend adapter, const Qkv& x, AttentionSpec spec) {
  spec.dispatch.backend = adapter;
  auto r = attention(x.q, x.k, x.v, spec);
  EXPECT_TRUE(r) << r.error().to_string();
  if (!r) return {};
  EXPECT_EQ(r.value().dispatch.served, adapter);
  return std::move(r).value();
}

class AttentionConformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    at::manual_seed(testing::kSeed);
    // An adapter that declines attention (native: no release has a C++
    // attention path of its own) has nothing to check numerically;
    // AttentionDispatch pins the refusal. Validation runs before dispatch,
    // so the bad-input table runs on every adapter.
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    if (name.rfind("BadInput", 0) == 0) return;
    if (const std::string why = testing::attention_refusal(GetParam()); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }
  AttentionSpec on_adapter(AttentionSpec spec) const {
    spec.dispatch.backend = GetParam();
    return spec;
  }
  AttentionOutput run(const Qkv& x, AttentionSpec spec) const {
    return run_on(GetParam(), x, std::move(spec));
  }
};

// One named mask case per test, on every adapter that serves attention.
class MaskConformance : public ::testing::TestWithParam<std::tuple<Backend, std::string>> {
 protected:
  void SetUp() override {
    at::manual_seed(testing::kSeed);
    if (const std::string why = testing::attention_refusal(adapter()); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }
  Backend adapter() const { return std::get<0>(GetParam()); }
  const MaskCase& mask() const { return mask_named(std::get<1>(GetParam())); }
  AttentionOutput run(const Qkv& x, AttentionSpec spec) const {
    return run_on(adapter(), x, std::move(spec));
  }
};

TEST_P(MaskConformance, MatchesFloat64Reference) {
  const Shape s;
  for (bool lse : {false, true}) {
    SCOPED_TRACE(lse ? "with lse" : "without lse");
    const Qkv x = make_qkv(s);
    AttentionSpec spec = mask().spec(s);
    spec.return_lse = lse;
    expect_within_rule(x, spec, run(x, spec), 1e-6);
  }
}

// With q = 0 every visible key scores the same, and v = the identity makes
// out[i, j] = 1 / (visible count) exactly where key j is visible: the mask
// keel applied can be read back and compared bit for bit.
TEST_P(MaskConformance, IsExactlyTheMaterialisedMask) {
  Shape s;
  s.Lq = 150;
  s.Lk = 170;
  s.Ev = s.Lk;
  Qkv x{at::zeros({s.B, s.Hq, s.Lq, s.E}, at::kDouble),
        at::randn({s.B, s.Hkv, s.Lk, s.E}, at::kDouble),
        at::eye(s.Lk, at::kDouble).expand({s.B, s.Hkv, s.Lk, s.Lk}).contiguous()};
  const AttentionSpec spec = mask().spec(s);
  const AttentionOutput got = run(x, spec);
  const at::Tensor want = reference::attention_mask(spec, s.B, s.Hq, s.Lq, s.Lk);
  EXPECT_TRUE(at::equal(got.out > 0, want));
}

TEST_P(AttentionConformance, QueryAndKeyLengthsDifferWithBothAlignments) {
  for (const auto& [lq, lk] :
       {std::pair<std::int64_t, std::int64_t>{1, 300}, {77, 300}, {300, 77}, {130, 129}}) {
    Shape s;
    s.Lq = lq;
    s.Lk = lk;
    for (CausalAlignment a : {CausalAlignment::top_left, CausalAlignment::bottom_right}) {
      for (bool window : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "Lq " << lq << " Lk " << lk << " alignment "
                                          << static_cast<int>(a) << " window " << window);
        const Qkv x = make_qkv(s);
        AttentionSpec spec =
            with_masks({window ? Mask::sliding_window(33, 0, a) : Mask::causal(a)});
        spec.return_lse = true;
        expect_within_rule(x, spec, run(x, spec), 1e-6);
        spec.return_lse = false;
        expect_within_rule(x, spec, run(x, spec), 1e-6);
      }
    }
  }
}

TEST_P(AttentionConformance, GroupedAndMultiQueryAttentionAndOddShapes) {
  struct Case {
    const char* name;
    Shape s;
  };
  const Case cases[] = {{"gqa", {2, 8, 2, 130, 130, 32, 32}},
                        {"mqa", {3, 4, 1, 129, 129, 32, 32}},
                        {"head dim 80, Ev != E", {1, 2, 2, 100, 140, 80, 48}},
                        {"decode Lq=1", {3, 4, 1, 1, 257, 64, 64}}};
  for (const Case& c : cases) {
    for (const char* mask_name : {"none", "causal_bottom_right", "sliding_window"}) {
      const MaskCase& m = mask_named(mask_name);
      SCOPED_TRACE(std::string(c.name) + " " + m.name);
      const Qkv x = make_qkv(c.s);
      AttentionSpec spec = m.spec(c.s);
      expect_within_rule(x, spec, run(x, spec), 1e-6);
      spec.return_lse = true;
      expect_within_rule(x, spec, run(x, spec), 1e-6);
    }
  }
}

TEST_P(AttentionConformance, EveryScoreModifierMatchesReference) {
  const Shape s;
  const std::vector<std::pair<const char*, std::function<void(AttentionSpec&)>>> modifiers = {
      {"scale", [](AttentionSpec& p) { p.scale = 0.37; }},
      {"softcap", [](AttentionSpec& p) { p.softcap = 1.5; }},
      {"alibi", [&](AttentionSpec& p) { p.alibi_slopes = at::rand({s.Hq}) * 0.2; }},
      {"alibi_bottom_right",
       [&](AttentionSpec& p) {
         p.alibi_slopes = at::rand({s.Hq}) * 0.2;
         p.alibi_alignment = CausalAlignment::bottom_right;
       }},
      {"bias",
       [&](AttentionSpec& p) {
         p.bias = at::randn({s.B, s.Hq, s.Lq, s.Lk});
       }},
      {"broadcast_bias", [&](AttentionSpec& p) { p.bias = at::randn({s.Lk}); }},
      {"additive_mask_bias",
       [&](AttentionSpec& p) {
         p.bias = at::where(at::rand({1, 1, s.Lq, s.Lk}) > 0.5, at::zeros({}), at::full({}, -kInf));
       }},
      {"all", [&](AttentionSpec& p) {
         p.scale = 0.2;
         p.softcap = 3.0;
         p.alibi_slopes = at::rand({s.Hq}) * 0.1;
         p.bias = at::randn({1, s.Hq, 1, s.Lk});
       }}};
  for (const auto& [name, apply] : modifiers) {
    for (const char* mask_name :
         {"none", "causal_top_left", "sliding_window", "causal_and_document"}) {
      const MaskCase& m = mask_named(mask_name);
      for (bool lse : {false, true}) {
        SCOPED_TRACE(std::string(name) + " " + m.name + (lse ? " lse" : ""));
        const Qkv x = make_qkv(s);
        AttentionSpec spec = m.spec(s);
        apply(spec);
        spec.return_lse = lse;
        expect_within_rule(x, spec, run(x, spec), 1e-6);
      }
    }
  }
}

TEST_P(AttentionConformance, HalfPrecisionWithinTwiceTheNaiveError) {
  const Shape s;
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (const char* mask_name :
         {"none", "causal_top_left", "sliding_window", "document", "block_mask", "bool_tensor"}) {
      const MaskCase& m = mask_named(mask_name);
      for (bool lse : {false, true}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + m.name + (lse ? " lse" : ""));
        const Qkv x = make_qkv(s, dtype);
        AttentionSpec spec = m.spec(s);
        spec.return_lse = lse;
        spec.softcap = lse ? 2.0 : 0.0;
        expect_within_rule(x, spec, run(x, spec), 1e-3);
      }
    }
  }
}

TEST_P(AttentionConformance, FullyMaskedRowGivesZeroOutputAndMinusInfLse) {
  Shape s;
  s.Lq = 40;
  s.Lk = 60;
  at::Tensor keep = at::rand({s.B, 1, s.Lq, s.Lk}) > 0.5;
  keep.select(2, 3).fill_(false);  // query 3 sees nothing, in every batch
  at::Tensor bias_mask = at::zeros({s.B, s.Hq, s.Lq, s.Lk}, at::kDouble);
  bias_mask.select(2, 5).fill_(-kInf);
  const std::vector<std::pair<const char*, AttentionSpec>> specs = {
      {"bool tensor", with_masks({Mask::from_tensor(keep)})},
      {"zero kv length", with_masks({Mask::key_padding(at::tensor({0, 60}, at::kLong))})},
      {"window before every key",
       with_masks({Mask::sliding_window(0, 0, CausalAlignment::bottom_right), Mask::causal()})},
      {"causal with Lq > Lk, bottom-right",
       with_masks({Mask::causal(CausalAlignment::bottom_right)})},
      {"-inf bias row", [&] {
         AttentionSpec p;
         p.bias = bias_mask;
         return p;
       }()}};
  for (const auto& [name, base] : specs) {
    for (bool lse : {false, true}) {
      SCOPED_TRACE(std::string(name) + (lse ? " lse" : ""));
      Shape shape = s;
      if (std::string(name).find("Lq > Lk") != std::string::npos) shape.Lq = 80;
      Qkv x = make_qkv(shape, at::kDouble);
      x.q.requires_grad_(true);
      x.k.requires_grad_(true);
      x.v.requires_grad_(true);
      AttentionSpec spec = base;
      spec.return_lse = lse;
      const AttentionOutput got = run(x, spec);
      ASSERT_TRUE(got.out.defined());
      const at::Tensor keep_all =
          reference::attention_mask(spec, shape.B, shape.Hq, shape.Lq, shape.Lk);
      at::Tensor empty = keep_all.logical_not().all(-1);
      if (spec.bias.defined()) empty = empty | spec.bias.isneginf().all(-1);
      ASSERT_TRUE(empty.any().item<bool>()) << "the case must hold a fully masked row";
      EXPECT_FALSE(got.out.isnan().any().item<bool>());
      EXPECT_EQ(got.out.masked_select(empty.unsqueeze(-1)).abs().max().item<double>(), 0.0);
      if (lse) {
        EXPECT_TRUE(got.lse.masked_select(empty).isneginf().all().item<bool>());
        EXPECT_FALSE(got.lse.isnan().any().item<bool>());
      }
      const at::Tensor loss =
          got.out.sum() + (lse ? got.lse.masked_fill(empty, 0).sum() : at::zeros({}));
      const auto grads = torch::autograd::grad({loss}, {x.q, x.k, x.v});
      for (const at::Tensor& g : grads) EXPECT_FALSE(g.isnan().any().item<bool>());
      EXPECT_EQ(grads[0].masked_select(empty.unsqueeze(-1)).abs().max().item<double>(), 0.0);
      expect_within_rule(x, spec, got, 1e-12);
    }
  }
}

TEST_P(AttentionConformance, EmptySequencesAreValid) {
  Shape s;
  s.Lq = 0;
  const AttentionOutput a = run(make_qkv(s), AttentionSpec{});
  EXPECT_EQ(a.out.sizes(), (std::vector<std::int64_t>{s.B, s.Hq, 0, s.Ev}));
  s.Lq = 5;
  s.Lk = 0;
  AttentionSpec spec;
  spec.return_lse = true;
  const AttentionOutput b = run(make_qkv(s), spec);
  EXPECT_EQ(b.out.sizes(), (std::vector<std::int64_t>{s.B, s.Hq, 5, s.Ev}));
  EXPECT_EQ(b.out.abs().max().item<double>(), 0.0);
  EXPECT_TRUE(b.lse.isneginf().all().item<bool>());
}

// Gradients of q, k, v and the bias against float64 reference autograd.
TEST_P(MaskConformance, GradientsMatchReferenceAutograd) {
  Shape s;
  s.Lq = 150;
  s.Lk = 170;
  for (bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "bias, softcap and lse" : "plain");
    Qkv x = make_qkv(s);
    AttentionSpec spec = mask().spec(s);
    // Without bias and lse the dense cases run on SDPA: its backward is pinned too.
    spec.return_lse = with_bias;
    spec.softcap = with_bias ? 4.0 : 0.0;
    std::vector<at::Tensor> inputs = {x.q.requires_grad_(true), x.k.requires_grad_(true),
                                      x.v.requires_grad_(true)};
    if (with_bias) {
      spec.bias = at::randn({1, s.Hq, s.Lq, s.Lk}).requires_grad_(true);
      inputs.push_back(spec.bias);
    }
    expect_gradients_within_rule(x, spec, run(x, spec), inputs, kGradientFloor);
  }
}

// C++ has no gradcheck: central differences in double on a tiny case, for
// each mask kind, against keel's own autograd.
TEST_P(AttentionConformance, FiniteDifferencesAgreeWithAutogradInDouble) {
  Shape s{1, 2, 1, 6, 7, 3, 2};
  for (const MaskCase& m : mask_cases()) {
    SCOPED_TRACE(m.name);
    Qkv x = make_qkv(s, at::kDouble);
    AttentionSpec spec = on_adapter(m.spec(s));
    spec.softcap = 2.0;
    spec.bias = at::randn({1, s.Hq, s.Lq, s.Lk}, at::kDouble);
    const at::Tensor up = at::randn({s.B, s.Hq, s.Lq, s.Ev}, at::kDouble);
    const auto loss = [&](const Qkv& in, const at::Tensor& bias) {
      AttentionSpec p = spec;
      p.bias = bias;
      return (attention(in.q, in.k, in.v, p).value().out * up).sum();
    };
    std::vector<at::Tensor> inputs = {x.q.requires_grad_(true), x.k.requires_grad_(true),
                                      x.v.requires_grad_(true), spec.bias.requires_grad_(true)};
    std::vector<at::Tensor> g;
    try {
      g = torch::autograd::grad({loss(x, spec.bias)}, inputs);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    c10::NoGradGuard no_grad;
    for (std::size_t n = 0; n < inputs.size(); ++n) {
      const at::Tensor flat = inputs[n].detach().clone().flatten();
      const at::Tensor grad = g[n].flatten();
      for (std::int64_t e = 0; e < flat.numel(); ++e) {
        const double eps = 1e-6;
        const auto eval = [&](double delta) {
          at::Tensor t = flat.clone();
          t[e] += delta;
          t = t.view(inputs[n].sizes());
          Qkv in{x.q.detach(), x.k.detach(), x.v.detach()};
          at::Tensor bias = spec.bias.detach();
          if (n == 0) in.q = t;
          if (n == 1) in.k = t;
          if (n == 2) in.v = t;
          if (n == 3) bias = t;
          return loss(in, bias).item<double>();
        };
        const double fd = (eval(eps) - eval(-eps)) / (2 * eps);
        EXPECT_NEAR(grad[e].item<double>(), fd, 1e-6) << "input " << n << " entry " << e;
      }
    }
  }
}

// Long enough for the flash route's batching: several query blocks of 128
// share one kernel call through overlapping key ranges (window), ranges
// differ per batch (documents), ranges with gaps merge by log-sum-exp (block
// mask), and query blocks with one range merge into one call (padding). The
// out, the lse and the gradients of q, k and v through both are checked.
TEST_P(AttentionConformance, BatchedFlashCallsMatchReferenceWithLseGradients) {
  Shape s{2, 4, 2, 700, 700, 32, 32};
  const at::Tensor ids0 = at::arange(s.Lq, at::kLong).floor_divide(256);
  const at::Tensor ids1 = at::arange(s.Lq, at::kLong).floor_divide(90);
  const at::Tensor ids = at::stack({ids0, ids1});
  const std::vector<std::pair<const char*, AttentionSpec>> cases = {
      {"window", with_masks({Mask::sliding_window(200, 0)})},
      {"two-sided window", with_masks({Mask::sliding_window(130, 60)})},
      {"chunked", with_masks({Mask::chunked_causal(256)})},
      {"documents per batch", with_masks({Mask::document(ids, ids)})},
      {"causal and documents", with_masks({Mask::causal(), Mask::document(ids, ids)})},
      {"key padding", with_masks({Mask::key_padding(at::tensor({700, 333}, at::kLong))})},
      {"block mask with gaps", with_masks({Mask::block_mask(random_block_mask(s, 128, true))})},
      {"no mask", AttentionSpec{}},
      {"causal", with_masks({Mask::causal()})}};
  for (const auto& [name, base] : cases) {
    SCOPED_TRACE(name);
    Qkv x = make_qkv(s);
    AttentionSpec spec = base;
    spec.return_lse = true;
    std::vector<at::Tensor> inputs = {x.q.requires_grad_(true), x.k.requires_grad_(true),
                                      x.v.requires_grad_(true)};
    const AttentionOutput got = run(x, spec);
    if (!got.out.defined()) continue;
    expect_within_rule(x, spec, got, 1e-6);
    EXPECT_EQ(got.dispatch.attention.route, AttentionRoute::block_sparse);
    EXPECT_GE(got.dispatch.attention.flash_kernel_calls, 1) << got.dispatch.reason;
    expect_gradients_within_rule(x, spec, got, inputs, kGradientFloor);
  }
}

// Causal diagonal blocks run under the kernel's own causal flag, without a
// mask: a mask that is causal in disguise (a window or one document as long
// as the sequence) is one causal call, and causal documents aligned to the
// 128-blocks are two calls (every diagonal block in one, the earlier blocks
// of each document unmasked in the other, merged by log-sum-exp). Documents
// are planned per batch (their ids may differ), so their counts are for
// both batches. Documents whose boundaries fall inside a block keep their
// masks. The numbers are checked against the float64 reference, the call
// counts in DispatchInfo.
TEST_P(AttentionConformance, CausalDiagonalsRunUnderTheKernelsCausalFlag) {
  Shape s{2, 2, 1, 640, 640, 32, 32};
  const auto per_batch = [&s](const at::Tensor& ids) { return ids.expand({s.B, s.Lq}); };
  const at::Tensor one_document = per_batch(at::zeros({s.Lq}, at::kLong));
  const at::Tensor aligned = per_batch(at::arange(s.Lq, at::kLong).floor_divide(256));
  const at::Tensor unaligned = per_batch(at::arange(s.Lq, at::kLong).floor_divide(200));
  const std::vector<std::tuple<const char*, AttentionSpec, std::int64_t>> cases = {
      {"window as long as the sequence", with_masks({Mask::sliding_window(640, 0)}), 1},
      {"one document", with_masks({Mask::causal(), Mask::document(one_document, one_document)}), 2},
      {"aligned documents", with_masks({Mask::causal(), Mask::document(aligned, aligned)}), 4},
      // Masked blocks: some calls, how many is the planner's business.
      {"unaligned documents", with_masks({Mask::causal(), Mask::document(unaligned, unaligned)}),
       0}};
  for (const auto& [name, base, calls] : cases) {
    SCOPED_TRACE(name);
    Qkv x = make_qkv(s);
    AttentionSpec spec = base;
    spec.return_lse = true;
    const AttentionOutput got = run(x, spec);
    ASSERT_TRUE(got.out.defined());
    expect_within_rule(x, spec, got, 1e-6);
    EXPECT_EQ(got.dispatch.attention.route, AttentionRoute::block_sparse);
    if (calls > 0) {
      EXPECT_EQ(got.dispatch.attention.flash_kernel_calls, calls) << got.dispatch.reason;
    } else {
      EXPECT_GE(got.dispatch.attention.flash_kernel_calls, 1) << got.dispatch.reason;
    }
    x.q.requires_grad_(true);
    x.k.requires_grad_(true);
    x.v.requires_grad_(true);
    expect_gradients_within_rule(x, spec, run(x, spec), {x.q, x.k, x.v}, kGradientFloor);
  }
}

TEST_P(AttentionConformance, DispatchInfoNamesThePath) {
  const Shape s;
  const Qkv x = make_qkv(s);
  const AttentionOutput dense = run(x, with_masks({Mask::causal()}));
  EXPECT_EQ(dense.dispatch.attention.route, AttentionRoute::dense) << dense.dispatch.reason;
  EXPECT_EQ(dense.dispatch.attention.visible_fraction, 1.0);
  const AttentionOutput sparse = run(x, with_masks({Mask::sliding_window(16, 0)}));
  EXPECT_EQ(sparse.dispatch.attention.route, AttentionRoute::block_sparse)
      << sparse.dispatch.reason;
  EXPECT_LT(sparse.dispatch.attention.visible_fraction, 1.0);
}

// Native declines attention: auto records why and runs compat, and an
// explicit native request is unsupported, never a silent fallback.
TEST(AttentionDispatch, NativeDeclinesAndAutoRunsCompat) {
  const Qkv x = make_qkv(Shape{});
  AttentionSpec spec = with_masks({Mask::causal()});
  spec.dispatch.backend = Backend::automatic;
  auto automatic = attention(x.q, x.k, x.v, spec);
  ASSERT_TRUE(automatic) << automatic.error().to_string();
  EXPECT_EQ(automatic.value().dispatch.served, Backend::compat);
  spec.dispatch.backend = Backend::native;
  auto native = attention(x.q, x.k, x.v, spec);
  ASSERT_FALSE(native);
  EXPECT_EQ(native.error().code(), Errc::unsupported);
}

TEST_P(AttentionConformance, BadInputIsInvalidArgumentNamingTheArgument) {
  const Shape s;
  const Qkv good = make_qkv(s);
  struct Case {
    const char* what;
    Qkv x;
    AttentionSpec spec;
    const char* names;
  };
  const auto spec_with = [](std::function<void(AttentionSpec&)> f) {
    AttentionSpec p;
    f(p);
    return p;
  };
  BlockMask bad_index = random_block_mask(s, 64, false);
  bad_index.kv_indices = bad_index.kv_indices.clone();
  bad_index.kv_indices.select(3, 0).fill_(99);
  bad_index.kv_num_blocks = at::ones_like(bad_index.kv_num_blocks);
  BlockMask bad_count = random_block_mask(s, 64, false);
  bad_count.kv_num_blocks = at::full_like(bad_count.kv_num_blocks, 9);
  BlockMask bad_dtype = random_block_mask(s, 64, false);
  bad_dtype.kv_indices = bad_dtype.kv_indices.to(at::kLong);
  BlockMask bad_shape = random_block_mask(s, 64, false);
  bad_shape.kv_num_blocks = bad_shape.kv_num_blocks.narrow(2, 0, 2);
  const std::vector<Case> cases = {
      {"undefined query", {at::Tensor(), good.k, good.v}, {}, "query"},
      {"rank 3 key", {good.q, good.k[0], good.v}, {}, "key has rank 3"},
      {"int dtype", {good.q.to(at::kInt), good.k, good.v}, {}, "query has dtype"},
      {"dtype mismatch", {good.q, good.k.to(at::kDouble), good.v}, {}, "key has dtype"},
      {"batch mismatch", {good.q, good.k.narrow(0, 0, 1), good.v}, {}, "batch"},
      {"heads do not divide",
       {good.q, at::randn({s.B, 3, s.Lk, s.E}), at::randn({s.B, 3, s.Lk, s.Ev})},
       {},
       "key has 3 heads, which does not divide the query's 4"},
      {"value heads", {good.q, good.k, good.v.narrow(1, 0, 1)}, {}, "value has 1 heads"},
      {"head dim", {good.q, good.k.narrow(3, 0, 16), good.v}, {}, "key has head dim 16"},
      {"value length", {good.q, good.k, good.v.narrow(2, 0, 10)}, {}, "value has sequence length"},
      {"nan scale", good, spec_with([](AttentionSpec& p) { p.scale = std::nan(""); }),
       "spec.scale"},
      {"negative softcap", good, spec_with([](AttentionSpec& p) { p.softcap = -1; }),
       "spec.softcap"},
      {"inf softcap", good, spec_with([](AttentionSpec& p) { p.softcap = kInf; }), "spec.softcap"},
      {"negative window", good, with_masks({Mask::sliding_window(-1, 0)}), "spec.masks[0]"},
      {"zero chunk", good, with_masks({Mask::causal(), Mask::chunked_causal(0)}),
       "spec.masks[1].chunk_size"},
      {"doc ids length", good,
       with_masks({Mask::document(at::zeros({s.B, s.Lq - 1}, at::kLong),
                                  at::zeros({s.B, s.Lk}, at::kLong))}),
       "spec.masks[0].q_document_ids"},
      {"doc ids dtype", good,
       with_masks({Mask::document(at::zeros({s.B, s.Lq}), at::zeros({s.B, s.Lk}, at::kLong))}),
       "spec.masks[0].q_document_ids has dtype"},
      {"prefix shape", good, with_masks({Mask::prefix_lm(at::zeros({s.B + 1}, at::kLong))}),
       "spec.masks[0].prefix_lengths"},
      {"padding undefined", good, with_masks({Mask::key_padding(at::Tensor())}),
       "spec.masks[0].kv_lengths"},
      {"block index out of range", good, with_masks({Mask::block_mask(bad_index)}),
       "spec.masks[0].block.kv_indices holds index 99"},
      {"block count above KVb", good, with_masks({Mask::block_mask(bad_count)}),
       "spec.masks[0].block.kv_num_blocks"},
      {"block dtype", good, with_masks({Mask::block_mask(bad_dtype)}), "int32"},
      {"block shape", good, with_masks({Mask::block_mask(bad_shape)}),
       "spec.masks[0].block.kv_num_blocks has shape"},
      {"mask tensor dtype", good, with_masks({Mask::from_tensor(at::ones({s.Lq, s.Lk}))}),
       "spec.masks[0].tensor has dtype"},
      {"mask tensor shape", good,
       with_masks({Mask::from_tensor(at::ones({s.Lq, s.Lk + 1}, at::kBool))}),
       "spec.masks[0].tensor has shape"},
      {"bias shape", good, spec_with([&](AttentionSpec& p) {
         p.bias = at::zeros({3, s.Lk});
       }),
       "spec.bias has shape"},
      {"bias dtype", good,
       spec_with([&](AttentionSpec& p) { p.bias = at::zeros({s.Lk}, at::kDouble); }),
       "spec.bias has dtype"},
      {"alibi shape", good,
       spec_with([&](AttentionSpec& p) { p.alibi_slopes = at::zeros({s.Hq + 1}); }),
       "spec.alibi_slopes"},
  };
  ASSERT_FALSE(cases.empty());
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto r = attention(c.x.q, c.x.k, c.x.v, on_adapter(c.spec));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Errc::invalid_argument);
    EXPECT_NE(r.error().message().find(c.names), std::string::npos) << r.error().message();
    EXPECT_EQ(r.error().message().rfind("attention: ", 0), 0u) << r.error().message();
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAdapter, AttentionConformance,
                         ::testing::ValuesIn(testing::adapters_in_build()), testing::adapter_name);
INSTANTIATE_TEST_SUITE_P(EveryAdapter, MaskConformance,
                         ::testing::Combine(::testing::ValuesIn(testing::adapters_in_build()),
                                            ::testing::ValuesIn(names_of(mask_cases()))),
                         adapter_and_case_name);

// Every integer of a mask spec at its extremes (0, 1, Lk - 1, Lk, Lk + 1,
// INT64_MAX, and negatives), for decode (Lq = 5) and training (Lq = 40)
// shapes: either a defined meaning, matched against the float64 reference
// (which compares differences, so it cannot overflow), or invalid_argument.
struct ExtremeCase {
  std::string name;
  Mask mask;
  bool valid;
};

constexpr std::int64_t kExtremeLk = 37;

std::vector<ExtremeCase> extreme_cases() {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::pair<const char*, std::int64_t>> values = {{"0", 0},
                                                                    {"1", 1},
                                                                    {"Lk_minus_1", kExtremeLk - 1},
                                                                    {"Lk", kExtremeLk},
                                                                    {"Lk_plus_1", kExtremeLk + 1},
                                                                    {"INT64_MAX", kMax},
                                                                    {"minus_1", -1},
                                                                    {"INT64_MIN", -kMax - 1}};
  std::vector<ExtremeCase> cases;
  for (const auto& [alignment, aname] :
       {std::pair{CausalAlignment::top_left, "top_left"},
        std::pair{CausalAlignment::bottom_right, "bottom_right"}}) {
    for (const auto& [vname, value] : values) {
      const std::string suffix = std::string(vname) + "_" + aname;
      cases.push_back(
          {"window_left_" + suffix, Mask::sliding_window(value, 0, alignment), value >= 0});
      cases.push_back(
          {"window_right_" + suffix, Mask::sliding_window(0, value, alignment), value >= 0});
      cases.push_back(
          {"window_both_" + suffix, Mask::sliding_window(value, value, alignment), value >= 0});
      cases.push_back({"chunk_" + suffix, Mask::chunked_causal(value, alignment), value > 0});
      cases.push_back(
          {"prefix_" + suffix, Mask::prefix_lm(at::full({2}, value, at::kLong), alignment), true});
    }
  }
  for (const auto& [vname, value] : values) {
    cases.push_back({std::string("kv_lengths_") + vname,
                     Mask::key_padding(at::tensor({value, std::int64_t{0}}, at::kLong)),
                     value >= 0 && value <= kExtremeLk});
  }
  return cases;
}

class MaskExtremes : public AdapterAndCase {};

TEST_P(MaskExtremes, DefinedMeaningOrInvalidArgument) {
  const std::vector<ExtremeCase> cases = extreme_cases();
  const ExtremeCase* it = &case_named(cases, case_name());
  for (std::int64_t lq : {5, 40}) {
    SCOPED_TRACE(::testing::Message() << "Lq " << lq);
    Shape s;
    s.Lq = lq;
    s.Lk = kExtremeLk;
    const Qkv x = make_qkv(s);
    AttentionSpec spec = with_masks({it->mask});
    spec.return_lse = true;
    spec.dispatch.backend = adapter();
    auto r = attention(x.q, x.k, x.v, spec);
    if (!it->valid) {
      ASSERT_FALSE(r);
      EXPECT_EQ(r.error().code(), Errc::invalid_argument);
      continue;
    }
    ASSERT_TRUE(r) << r.error().to_string();
    expect_within_rule(x, spec, r.value(), 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAdapter, MaskExtremes,
                         ::testing::Combine(::testing::ValuesIn(testing::adapters_in_build()),
                                            ::testing::ValuesIn(names_of(extreme_cases()))),
                         adapter_and_case_name);

}  // namespace
}  // namespace keel
