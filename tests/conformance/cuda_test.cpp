// The conformance suites on a CUDA device, for every adapter of this build:
// each call runs on CUDA and is checked against the float64 reference, which
// is computed on the CPU from the same (rounded) inputs. Every test skips,
// saying why, when keel was built without CUDA or no device is present.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "conformance/adapters.h"
#include "conformance/error_bounds.h"
#include "reference/attention_reference.h"
#include "reference/linear_cross_entropy_reference.h"
#include "reference/logsumexp_reference.h"

namespace keel {
namespace {

using testing::max_error;
using torch::autograd::variable_list;

at::Tensor longs(const std::vector<std::int64_t>& values) {
  return at::tensor(values);
}

at::Tensor on(const at::Tensor& t, const at::Device& d) {
  return t.defined() ? t.to(d) : t;
}

// The spec with every tensor it holds moved to `d`.
AttentionSpec spec_on(AttentionSpec spec, const at::Device& d) {
  for (Mask& m : spec.masks) {
    m.prefix_lengths = on(m.prefix_lengths, d);
    m.q_document_ids = on(m.q_document_ids, d);
    m.kv_document_ids = on(m.kv_document_ids, d);
    m.kv_lengths = on(m.kv_lengths, d);
    m.tensor = on(m.tensor, d);
    m.block.kv_num_blocks = on(m.block.kv_num_blocks, d);
    m.block.kv_indices = on(m.block.kv_indices, d);
    m.block.full_kv_num_blocks = on(m.block.full_kv_num_blocks, d);
    m.block.full_kv_indices = on(m.block.full_kv_indices, d);
  }
  spec.alibi_slopes = on(spec.alibi_slopes, d);
  spec.bias = on(spec.bias, d);
  return spec;
}

constexpr std::int64_t kB = 2, kHq = 4, kHkv = 2, kL = 300, kE = 64;

struct AttentionCase {
  const char* name;
  AttentionSpec spec;  // CPU tensors
  bool sdpa;           // whether keel should run SDPA for it
};

AttentionSpec masked(std::vector<Mask> masks, MaskCombine combine = MaskCombine::all_of) {
  AttentionSpec spec;
  spec.masks = std::move(masks);
  spec.combine = combine;
  return spec;
}

// A 128-block mask listing key blocks <= the query block whose index is even
// or equal to it: a sparse pattern no structured kind describes.
BlockMask even_blocks() {
  const std::int64_t blocks = (kL + 127) / 128;
  at::Tensor idx = at::zeros({1, 1, blocks, blocks}, at::kInt);
  at::Tensor cnt = at::zeros({1, 1, blocks}, at::kInt);
  for (std::int64_t r = 0; r < blocks; ++r) {
    int n = 0;
    for (std::int64_t c = 0; c <= r; ++c) {
      if (c % 2 == 0 || c == r) idx[0][0][r][n++] = static_cast<int>(c);
    }
    cnt[0][0][r] = n;
  }
  BlockMask bm;
  bm.kv_num_blocks = cnt;
  bm.kv_indices = idx;
  return bm;
}

std::vector<AttentionCase> attention_cases() {
  const at::Tensor docs =
      at::div(at::arange(kL, at::kLong), 70, "floor").unsqueeze(0).expand({kB, kL}).contiguous();
  std::vector<AttentionCase> cases = {
      {"none", {}, true},
      {"causal", masked({Mask::causal()}), true},
      {"boolean_tensor", masked({Mask::from_tensor(at::rand({kB, 1, kL, kL}) < 0.7)}), true},
      {"sliding_window", masked({Mask::sliding_window(64, 0)}), false},
      {"sliding_window_both_sides", masked({Mask::sliding_window(40, 17)}), false},
      {"chunked_causal", masked({Mask::chunked_causal(96)}), false},
      {"prefix_lm", masked({Mask::prefix_lm(longs({37, 150}))}), false},
      {"document", masked({Mask::document(docs, docs)}), false},
      {"key_padding", masked({Mask::key_padding(longs({kL, 211}))}), false},
      {"block_mask", masked({Mask::block_mask(even_blocks())}), false},
      {"window_or_prefix",
       masked({Mask::sliding_window(32, 0), Mask::prefix_lm(longs({64, 10}))}, MaskCombine::any_of),
       false},
  };
  AttentionSpec bias;
  bias.bias = at::randn({1, kHq, kL, kL}) * 0.5;
  cases.push_back({"additive_bias", bias, true});
  AttentionSpec lse = masked({Mask::causal()});
  lse.return_lse = true;
  cases.push_back({"causal_with_lse", lse, false});
  AttentionSpec capped = masked({Mask::sliding_window(50, 0)});
  capped.softcap = 5.0;
  cases.push_back({"softcap_window", capped, false});
  AttentionSpec alibi = masked({Mask::causal()});
  alibi.alibi_slopes = at::tensor({0.5, 0.25, 0.125, 0.0625}, at::kFloat);
  cases.push_back({"alibi_causal", alibi, true});
  return cases;
}

class CudaConformance : public ::testing::TestWithParam<Backend> {
 protected:
  AttentionOutput run_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                AttentionSpec spec) const {
    spec.dispatch.backend = GetParam();
    auto r = attention(q, k, v, spec);
    EXPECT_TRUE(r) << r.error().to_string();
    if (!r) return {};
    EXPECT_EQ(r.value().dispatch.served, GetParam());
    return std::move(r).value();
  }

  // Native declines linear_cross_entropy and attention (no release has a
  // C++ path of its own for either); the CPU suites pin that, so the numeric
  // CUDA tests skip them there.
  bool skip_loss() const { return GetParam() == Backend::native; }
  void SetUp() override {
    if (const std::string why = testing::cuda_unavailable(); !why.empty()) GTEST_SKIP() << why;
    at::manual_seed(testing::kSeed);
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const bool runs_attention = name.rfind("Attention", 0) == 0 ||
                                name.rfind("BlockSparse", 0) == 0 ||
                                name.rfind("SecondDevice", 0) == 0;
    if (!runs_attention) return;
    if (const std::string why = testing::attention_refusal(GetParam()); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }
};

// Every mask kind and modifier, in float32 and bfloat16, within twice the
// error of the same-precision naive computation (FlashAttention's rule).
TEST_P(CudaConformance, AttentionMatchesFloat64ReferenceForEveryMaskKind) {
  const at::Device cuda(at::kCUDA, 0);
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    // The naive computation runs on the CPU, keel on the GPU, whose GEMMs
    // and reductions sum in other orders: where the CPU's naive result
    // happens to be exact, keel's still rounds. The floor is a few roundings
    // of the O(1) outputs and O(10) log-sum-exps: 1e-4 in float32 (2^-24
    // relative, over sums of 300 terms), 2e-2 in bfloat16 (2^-8 relative).
    const double floor = dtype == at::kFloat ? 1e-4 : 2e-2;
    const at::Tensor q = at::randn({kB, kHq, kL, kE}).to(dtype);
    const at::Tensor k = at::randn({kB, kHkv, kL, kE}).to(dtype);
    const at::Tensor v = at::randn({kB, kHkv, kL, kE}).to(dtype);
    for (AttentionCase& c : attention_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + c10::toString(dtype));
      if (c.spec.alibi_slopes.defined() && dtype != at::kFloat) continue;
      if (c.spec.bias.defined()) c.spec.bias = c.spec.bias.to(dtype);
      const AttentionOutput got =
          run_attention(q.to(cuda), k.to(cuda), v.to(cuda), spec_on(c.spec, cuda));
      ASSERT_TRUE(got.out.defined());
      EXPECT_EQ(got.out.device(), cuda);
      EXPECT_EQ(got.out.scalar_type(), dtype);
      EXPECT_FALSE(got.out.isnan().any().item<bool>());
      const auto [ref_out, ref_lse] = reference::attention(q, k, v, c.spec);
      const auto [naive_out, naive_lse] = reference::attention(q, k, v, c.spec, dtype);
      const double err = max_error(got.out, ref_out);
      const double naive = max_error(naive_out, ref_out);
      EXPECT_LE(err, 2 * naive + floor) << "out error " << err << ", naive " << naive;
      if (c.spec.return_lse) {
        ASSERT_TRUE(got.lse.defined());
        EXPECT_EQ(got.lse.device(), cuda);
        EXPECT_LE(max_error(got.lse, ref_lse), 2 * max_error(naive_lse, ref_lse) + floor);
      }
      EXPECT_EQ(got.dispatch.attention.route,
                c.sdpa ? AttentionRoute::dense : AttentionRoute::block_sparse)
          << got.dispatch.reason;
    }
  }
}

// The block-sparse path's cost follows the visible blocks on CUDA too: a
// 128-wide window over 1024 keys multiplies under a quarter of the blocks.
TEST_P(CudaConformance, BlockSparseSkipsHiddenBlocks) {
  const at::Device cuda(at::kCUDA, 0);
  const std::int64_t L = 1024;
  const at::Tensor q = at::randn({1, 2, L, 32}, at::TensorOptions(cuda));
  const AttentionOutput got = run_attention(q, q, q, masked({Mask::sliding_window(128, 0)}));
  EXPECT_EQ(got.dispatch.attention.route, AttentionRoute::block_sparse) << got.dispatch.reason;
  EXPECT_LT(got.dispatch.attention.visible_fraction, 0.3) << got.dispatch.reason;
}

// Gradients through SDPA and through the block-sparse path, on CUDA,
// against autograd on the float64 reference.
TEST_P(CudaConformance, AttentionGradientsMatchReferenceAutograd) {
  const at::Device cuda(at::kCUDA, 0);
  const std::int64_t L = 200;
  for (const AttentionSpec& spec : {masked({Mask::causal()}), masked({Mask::sliding_window(48, 0)}),
                                    masked({Mask::key_padding(longs({L, 133}))})}) {
    const at::Tensor q = at::randn({kB, kHq, L, 32}, at::kDouble);
    const at::Tensor k = at::randn({kB, kHkv, L, 32}, at::kDouble);
    const at::Tensor v = at::randn({kB, kHkv, L, 32}, at::kDouble);
    const at::Tensor up = at::randn({kB, kHq, L, 32}, at::kDouble);
    const at::Tensor qc = q.to(cuda, at::kFloat).requires_grad_(true);
    const at::Tensor kc = k.to(cuda, at::kFloat).requires_grad_(true);
    const at::Tensor vc = v.to(cuda, at::kFloat).requires_grad_(true);
    const AttentionOutput got = run_attention(qc, kc, vc, spec_on(spec, cuda));
    ASSERT_TRUE(got.out.defined());
    const variable_list g =
        torch::autograd::grad({(got.out.to(at::kDouble) * up.to(cuda)).sum()}, {qc, kc, vc});
    const at::Tensor q64 = q.requires_grad_(true);
    const at::Tensor k64 = k.requires_grad_(true);
    const at::Tensor v64 = v.requires_grad_(true);
    const at::Tensor ref = reference::attention(q64, k64, v64, spec).first;
    const variable_list want = torch::autograd::grad({(ref * up).sum()}, {q64, k64, v64});
    // keel computes in float32 against a float64 reference: the gradients
    // are sums of 200 products of O(1) terms, O(10) in size, rounded in
    // float32 in whatever order cuBLAS chooses; 1e-3 is about a hundred
    // roundings of them (2^-24 * 10 * 200 * 25 = 3e-3 is the worst case).
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(g[i].device(), cuda);
      EXPECT_LE(max_error(g[i], want[i]), 1e-3)
          << "gradient " << i << " of " << got.dispatch.reason;
    }
  }
}

// A tensor left on the CPU is a keel::Error naming it, never a crash inside
// a CUDA kernel.
TEST_P(CudaConformance, InputsOnTwoDevicesAreInvalidArgumentNamingTheArgument) {
  const at::Device cuda(at::kCUDA, 0);
  const at::Tensor q = at::randn({1, 2, 16, 8}, at::TensorOptions(cuda));
  const at::Tensor cpu = at::randn({1, 2, 16, 8});
  AttentionSpec spec;
  spec.dispatch.backend = GetParam();
  auto r = attention(q, cpu, q, spec);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Errc::invalid_argument);
  EXPECT_NE(r.error().message().find("key is on cpu"), std::string::npos) << r.error().message();
  spec.masks = {Mask::key_padding(longs({9}))};
  r = attention(q, q, q, spec);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Errc::invalid_argument);
  EXPECT_NE(r.error().message().find("kv_lengths"), std::string::npos) << r.error().message();

  LinearCrossEntropyOptions o;
  o.dispatch.backend = GetParam();
  const at::Tensor h = at::randn({4, 8}, at::TensorOptions(cuda));
  auto loss = linear_cross_entropy(h, at::randn({10, 8}), at::zeros({4}, at::kLong).to(cuda), o);
  ASSERT_FALSE(loss);
  EXPECT_EQ(loss.error().code(), Errc::invalid_argument);
  EXPECT_NE(loss.error().message().find("weight is on cpu"), std::string::npos)
      << loss.error().message();
}

// The fused loss with bf16 inputs on CUDA: float32 loss (fp32 accumulation),
// bf16 gradients, against the float64 reference from the same rounded inputs.
TEST_P(CudaConformance, LossInBfloat16AccumulatesInFloat32) {
  if (skip_loss()) GTEST_SKIP() << "native declines linear_cross_entropy";
  const at::Device cuda(at::kCUDA, 0);
  const std::int64_t N = 96, D = 64, V = 1000;
  const at::Tensor h = (at::randn({N, D}) * 0.5).to(at::kBFloat16);
  const at::Tensor w = (at::randn({V, D}) * 0.2).to(at::kBFloat16);
  const at::Tensor b = (at::randn({V}) * 0.1).to(at::kBFloat16);
  at::Tensor y = at::randint(0, V, {N}, at::kLong);
  y.narrow(0, 0, 7).fill_(-100);
  reference::LinearCrossEntropyCase rc;
  rc.label_smoothing = 0.1;
  rc.z_loss = 1e-4;
  rc.logit_softcap = 20.0;
  rc.bias = b;
  LinearCrossEntropyOptions o;
  o.label_smoothing = rc.label_smoothing;
  o.z_loss = rc.z_loss;
  o.logit_softcap = rc.logit_softcap;
  o.bias = b.to(cuda);
  o.chunk_size = 32;  // several chunks
  o.dispatch.backend = GetParam();
  const at::Tensor hc = h.to(cuda).requires_grad_(true);
  const at::Tensor wc = w.to(cuda).requires_grad_(true);
  auto r = linear_cross_entropy(hc, wc, y.to(cuda), o);
  ASSERT_TRUE(r) << r.error().to_string();
  const at::Tensor loss = r.value().loss;
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_EQ(loss.device(), cuda);
  const variable_list g = torch::autograd::grad({loss}, {hc, wc});
  EXPECT_EQ(g[0].scalar_type(), at::kBFloat16);
  EXPECT_EQ(g[1].scalar_type(), at::kBFloat16);

  const at::Tensor h64 = h.to(at::kDouble).requires_grad_(true);
  const at::Tensor w64 = w.to(at::kDouble).requires_grad_(true);
  const at::Tensor ref = reference::linear_cross_entropy(h64, w64, y, rc).loss;
  const variable_list want = torch::autograd::grad({ref}, {h64, w64});
  // bf16 logits (the GEMM's output) round at 2^-8 of their size; the loss
  // and its gradients are sums in float32 on top.
  EXPECT_LE(max_error(loss, ref), 2e-2);
  for (std::size_t i = 0; i < 2; ++i) {
    const double scale = want[i].abs().max().item<double>();
    // 2e-2 of the largest gradient: a few bf16 roundings (2^-8) of the
    // logits it is formed from; 1e-4 for gradients of entries near zero.
    EXPECT_LE(max_error(g[i], want[i]), 2e-2 * scale + 1e-4) << "gradient " << i;
  }
}

// Every option of the fused loss gives on CUDA what it gives on the CPU.
TEST_P(CudaConformance, LossOptionsOnCudaMatchTheCpu) {
  if (skip_loss()) GTEST_SKIP() << "native declines linear_cross_entropy";
  const at::Device cuda(at::kCUDA, 0);
  const std::int64_t N = 50, D = 24, V = 300;
  struct Row {
    const char* name;
    Reduction reduction;
    double smoothing, z, cap;
    bool class_weights, bias;
  };
  for (const Row& c : {Row{"mean", Reduction::mean, 0, 0, 0, false, false},
                       Row{"sum_weighted_smoothing", Reduction::sum, 0.2, 0, 0, true, false},
                       Row{"none_bias_cap_z", Reduction::none, 0, 1e-3, 10, false, true},
                       Row{"mean_everything", Reduction::mean, 0.1, 1e-4, 15, true, true}}) {
    SCOPED_TRACE(c.name);
    const at::Tensor h = at::randn({N, D});
    const at::Tensor w = at::randn({V, D}) * 0.3;
    at::Tensor y = at::randint(0, V, {N}, at::kLong);
    y.narrow(0, 3, 5).fill_(-100);
    LinearCrossEntropyOptions o;
    o.reduction = c.reduction;
    o.label_smoothing = c.smoothing;
    o.z_loss = c.z;
    o.logit_softcap = c.cap;
    o.chunk_size = 16;
    o.return_lse = true;
    if (c.class_weights) o.class_weights = at::rand({V}) + 0.5;
    if (c.bias) o.bias = at::randn({V});
    o.dispatch.backend = GetParam();
    const at::Tensor up = at::randn({N});
    const auto run = [&](const at::Device& d) {
      LinearCrossEntropyOptions od = o;
      od.class_weights = on(o.class_weights, d);
      od.bias = on(o.bias, d);
      const at::Tensor hd = h.to(d).requires_grad_(true);
      const at::Tensor wd = w.to(d).requires_grad_(true);
      auto r = linear_cross_entropy(hd, wd, y.to(d), od);
      EXPECT_TRUE(r) << r.error().to_string();
      if (!r) return variable_list{};
      const at::Tensor& loss = r.value().loss;
      const variable_list g = loss.dim() == 0 ? torch::autograd::grad({loss}, {hd, wd})
                                              : torch::autograd::grad({loss}, {hd, wd}, {up.to(d)});
      return variable_list{loss.detach(), r.value().lse, g[0], g[1]};
    };
    const variable_list cpu = run(at::kCPU);
    const variable_list gpu = run(cuda);
    ASSERT_EQ(cpu.size(), 4u);
    ASSERT_EQ(gpu.size(), 4u);
    // The same float32 computation on two devices, summed in different
    // orders: 1e-4 relative is a few hundred float32 roundings (2^-24),
    // 1e-5 absolute for entries near zero.
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(gpu[i].device(), cuda);
      EXPECT_TRUE(at::allclose(gpu[i].cpu(), cpu[i], 1e-4, 1e-5))
          << "output " << i << ": max abs difference " << max_error(gpu[i], cpu[i]);
    }
  }
}

TEST_P(CudaConformance, MaskedLogsumexpMatchesReference) {
  const at::Device cuda(at::kCUDA, 0);
  const at::Tensor x = at::randn({6, 129}).to(at::kBFloat16);
  at::Tensor mask = at::rand({6, 129}) < 0.5;
  mask[2].fill_(false);  // an empty row: -inf
  LogsumexpOptions o;
  o.mask = mask.to(cuda);
  o.dispatch.backend = GetParam();
  auto r = logsumexp(x.to(cuda), o);
  if (GetParam() == Backend::native) {
    // Native serves no mask (the CPU suite pins the message).
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Errc::unsupported);
    o.mask = at::Tensor();
    r = logsumexp(x.to(cuda), o);
    mask = at::Tensor();
  }
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r.value().value.device(), cuda);
  EXPECT_EQ(r.value().value.scalar_type(), at::kFloat);
  const at::Tensor want = reference::logsumexp(x, mask, -1, false);
  const at::Tensor got = r.value().value.cpu().to(at::kDouble);
  EXPECT_TRUE(at::equal(got.isneginf(), want.isneginf()));
  // float32 log-sum-exps of O(1) rows are O(10): 1e-5 is a few roundings.
  EXPECT_LE(max_error(got, want), 1e-5);
}

// Inputs on a second device run there, whatever the current device is.
TEST_P(CudaConformance, SecondDeviceRunsOnThatDevice) {
  if (at::getNumGPUs() < 2) GTEST_SKIP() << "one CUDA device: nothing to check across devices";
  const at::Device second(at::kCUDA, 1);
  const at::Tensor q = at::randn({1, 2, 256, 32});
  for (const AttentionSpec& spec :
       {masked({Mask::causal()}), masked({Mask::sliding_window(64, 0)})}) {
    const AttentionOutput got = run_attention(q.to(second), q.to(second), q.to(second), spec);
    ASSERT_TRUE(got.out.defined());
    EXPECT_EQ(got.out.device(), second);
    // float32 on the GPU against float64 (as the floor of
    // AttentionMatchesFloat64ReferenceForEveryMaskKind).
    EXPECT_LE(max_error(got.out, reference::attention(q, q, q, spec).first), 1e-4);
  }
  if (skip_loss()) return;
  LinearCrossEntropyOptions o;
  o.dispatch.backend = GetParam();
  const at::Tensor h = at::randn({20, 16});
  const at::Tensor w = at::randn({40, 16});
  const at::Tensor y = at::randint(0, 40, {20}, at::kLong);
  auto r = linear_cross_entropy(h.to(second), w.to(second), y.to(second), o);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r.value().loss.device(), second);
  const at::Tensor want = reference::linear_cross_entropy(h, w, y, {}).loss;
  EXPECT_LE(max_error(r.value().loss, want), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(EveryAdapter, CudaConformance,
                         ::testing::ValuesIn(testing::adapters_in_build()), testing::adapter_name);

}  // namespace
}  // namespace keel
