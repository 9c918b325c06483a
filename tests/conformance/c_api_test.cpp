// keel's C ABI (include/keel/c/): this build's plugin, loaded by the loader
// in this process, against keel::v1 called directly on the same inputs
// (bitwise: the plugin runs the same release's v1), inputs read in place,
// the struct-size rules, and every bad input or bad plugin an error value.
// Tensors cross with libtorch's own DLPack functions, as docs/c-api.md's
// bridge shows a service on libtorch.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include "conformance/adapters.h"
#include "conformance/attention_support.h"
#include "conformance/c_api_support.h"
#include "keel/c/keel.hpp"
#include "keel/keel.h"
#include "plugin/common.h"
#include "plugin/dlpack_bridge.h"

namespace keel {
namespace {

using CTensor = keel::c::Tensor;

// A caller-owned DLPack tensor that shares `t`'s memory (libtorch's bridge).
CTensor dl(const at::Tensor& t) {
  return CTensor::adopt(at::toDLPackVersioned(t));
}
// The output as an at::Tensor, ownership passed to libtorch.
at::Tensor from(CTensor& t) {
  return t ? at::fromDLPackVersioned(t.release()) : at::Tensor();
}

using testing::bitwise;

const keel::c::Plugin& plugin() {
  return testing::this_plugin();
}

at::Tensor randn(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::randn(shape, at::kDouble).to(dtype);
}

TEST(CApiConformance, PluginSaysWhatItIsAndWhatItServes) {
  keel::c::Result<keel::c::PluginInfo> info = plugin().info();
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info.value().torch_release, build_info().torch_version);
  EXPECT_EQ(info.value().torch_loaded, build_info().torch_version);
  EXPECT_EQ(info.value().keel_version, std::string(version()));
  EXPECT_EQ(info.value().api_major, KEEL_C_API_MAJOR);
  EXPECT_EQ(info.value().api_minor, KEEL_C_API_MINOR);
  EXPECT_NE(info.value().build_info_json.find("\"adapters\""), std::string::npos);
  keel::c::Result<std::string> f32 =
      plugin().serves(KEEL_OPERATION_ATTENTION, DLDataType{kDLFloat, 32, 1});
  ASSERT_TRUE(f32);
  EXPECT_EQ(f32.value(), "compat");
  keel::c::Result<std::string> ints =
      plugin().serves(KEEL_OPERATION_ATTENTION, DLDataType{kDLInt, 32, 1});
  ASSERT_TRUE(ints);
  EXPECT_EQ(ints.value(), "");
}

struct AttentionCase {
  const char* name;
  at::ScalarType dtype;
  std::int64_t hq, hkv, lq, lk;
  std::function<void(AttentionSpec&, keel::c::AttentionSpec&, std::vector<at::Tensor>&,
                     std::vector<CTensor>&)>
      masks;
};

class CApiAttention : public ::testing::TestWithParam<AttentionCase> {};

// Forward (out and lse) and backward (dq, dk, dv, dbias) through the C ABI
// equal keel::v1's, bitwise.
TEST_P(CApiAttention, EqualsV1Bitwise) {
  const AttentionCase& c = GetParam();
  at::manual_seed(11);
  const at::Tensor q = randn({2, c.hq, c.lq, 16}, c.dtype),
                   k = randn({2, c.hkv, c.lk, 16}, c.dtype),
                   v = randn({2, c.hkv, c.lk, 16}, c.dtype),
                   dout = randn({2, c.hq, c.lq, 16}, c.dtype);
  AttentionSpec spec;
  keel::c::AttentionSpec cspec;
  std::vector<at::Tensor> keep;
  std::vector<CTensor> ckeep;
  c.masks(spec, cspec, keep, ckeep);
  spec.return_lse = true;
  result<AttentionOutput> want = attention(q, k, v, spec);
  ASSERT_TRUE(want) << want.error().to_string();
  CTensor cq = dl(q), ck = dl(k), cv = dl(v), cdout = dl(dout);
  keel::c::Result<keel::c::AttentionResult> got = plugin().attention(cq, ck, cv, cspec.get(), true);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_TRUE(bitwise(from(got.value().out), want.value().out));
  EXPECT_TRUE(bitwise(from(got.value().lse), want.value().lse));

  const at::Tensor qg = q.clone().requires_grad_(), kg = k.clone().requires_grad_(),
                   vg = v.clone().requires_grad_();
  at::Tensor bias;
  if (spec.bias.defined()) spec.bias = bias = spec.bias.clone().requires_grad_();
  spec.return_lse = false;
  result<AttentionOutput> fwd = attention(qg, kg, vg, spec);
  ASSERT_TRUE(fwd);
  fwd.value().out.backward(dout);
  keel::c::Result<keel::c::AttentionGradients> g =
      plugin().attention_backward(cq, ck, cv, cspec.get(), cdout);
  ASSERT_TRUE(g) << g.error().message();
  EXPECT_TRUE(bitwise(from(g.value().dq), qg.grad()));
  EXPECT_TRUE(bitwise(from(g.value().dk), kg.grad()));
  EXPECT_TRUE(bitwise(from(g.value().dv), vg.grad()));
  if (bias.defined()) {
    EXPECT_TRUE(bitwise(from(g.value().dbias), bias.grad()));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CApiAttention,
    ::testing::Values(
        AttentionCase{"gqa4_2_causal_bottom_right_f32", at::kFloat, 4, 2, 3, 7,
                      [](AttentionSpec& s, keel::c::AttentionSpec& c, auto&, auto&) {
                        s.masks.push_back(Mask::causal(CausalAlignment::bottom_right));
                        c.add(keel::c::mask(KEEL_MASK_CAUSAL, KEEL_ALIGN_BOTTOM_RIGHT));
                      }},
        AttentionCase{"window_softcap_alibi_f64", at::kDouble, 2, 2, 9, 9,
                      [](AttentionSpec& s, keel::c::AttentionSpec& c, auto& keep, auto& ckeep) {
                        s.masks.push_back(Mask::sliding_window(2, 1));
                        KEEL_Mask w = keel::c::mask(KEEL_MASK_SLIDING_WINDOW);
                        w.window_left = 2;
                        w.window_right = 1;
                        c.add(w);
                        s.softcap = c.fields().softcap = 4;
                        keep.push_back(at::tensor({0.5, 0.25}, at::kFloat));
                        s.alibi_slopes = keep.back();
                        ckeep.push_back(dl(keep.back()));
                        c.fields().alibi_slopes = ckeep.back().get();
                      }},
        AttentionCase{
            "documents_padding_bias_f32", at::kFloat, 2, 1, 6, 6,
            [](AttentionSpec& s, keel::c::AttentionSpec& c, auto& keep, auto& ckeep) {
              const at::Tensor ids =
                  at::tensor({0, 0, 1, 1, 1, 2, 0, 1, 1, 2, 2, 2}, at::kLong).view({2, 6});
              const at::Tensor lengths = at::tensor({5, 0}, at::kLong);
              const at::Tensor bias = randn({2, 2, 6, 6}, at::kFloat);
              keep.insert(keep.end(), {ids, lengths, bias});
              s.masks.push_back(Mask::document(ids, ids));
              s.masks.push_back(Mask::key_padding(lengths));
              s.bias = bias;
              ckeep.push_back(dl(ids));
              ckeep.push_back(dl(lengths));
              ckeep.push_back(dl(bias));
              KEEL_Mask d = keel::c::mask(KEEL_MASK_DOCUMENT);
              d.q_document_ids = d.kv_document_ids = ckeep[0].get();
              KEEL_Mask p = keel::c::mask(KEEL_MASK_KEY_PADDING);
              p.kv_lengths = ckeep[1].get();
              c.add(d).add(p);
              c.fields().bias = ckeep[2].get();
            }},
        AttentionCase{"boolean_any_of_bf16", at::kBFloat16, 4, 4, 5, 8,
                      [](AttentionSpec& s, keel::c::AttentionSpec& c, auto& keep, auto& ckeep) {
                        const at::Tensor keepers = at::rand({2, 1, 5, 8}) > 0.5;
                        keep.push_back(keepers);
                        s.masks.push_back(Mask::causal());
                        s.masks.push_back(Mask::from_tensor(keepers));
                        s.combine = MaskCombine::any_of;
                        ckeep.push_back(dl(keepers));
                        KEEL_Mask t = keel::c::mask(KEEL_MASK_TENSOR);
                        t.tensor = ckeep.back().get();
                        c.add(keel::c::mask(KEEL_MASK_CAUSAL)).add(t);
                        c.fields().combine_any = 1;
                      }}),
    [](const ::testing::TestParamInfo<AttentionCase>& info) {
      return std::string(info.param.name);
    });

TEST(CApiConformance, PagedEqualsV1Bitwise) {
  at::manual_seed(12);
  const at::Tensor q = randn({2, 4, 2, 16}, at::kFloat);
  PagedKVCache cache;
  cache.k_pages = randn({6, 2, 4, 16}, at::kFloat);
  cache.v_pages = randn({6, 2, 4, 16}, at::kFloat);
  cache.page_table = at::tensor({4, 1, 0, 5, 2, 3}, at::kInt).view({2, 3});
  cache.lengths = at::tensor({7, 10}, at::kInt);
  AttentionSpec spec;
  spec.masks.push_back(Mask::causal(CausalAlignment::bottom_right));
  spec.return_lse = true;
  result<AttentionOutput> want = [&] {
    c10::NoGradGuard no_grad;
    return attention(q, cache, spec);
  }();
  ASSERT_TRUE(want) << want.error().to_string();
  keel::c::AttentionSpec cspec;
  cspec.add(keel::c::mask(KEEL_MASK_CAUSAL, KEEL_ALIGN_BOTTOM_RIGHT));
  CTensor cq = dl(q), kp = dl(cache.k_pages), vp = dl(cache.v_pages), t = dl(cache.page_table),
          l = dl(cache.lengths);
  keel::c::Result<keel::c::AttentionResult> got =
      plugin().attention_paged(cq, kp, vp, t, l, cspec.get(), true);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_TRUE(bitwise(from(got.value().out), want.value().out));
  EXPECT_TRUE(bitwise(from(got.value().lse), want.value().lse));
}

TEST(CApiConformance, PackedPagedEqualsV1Bitwise) {
  at::manual_seed(16);
  PackedQueries packed{randn({8, 4, 16}, at::kFloat), at::tensor({0, 1, 4, 8}, at::kInt)};
  PagedKVCache cache;
  cache.k_pages = randn({8, 2, 4, 16}, at::kFloat);
  cache.v_pages = randn({8, 2, 4, 16}, at::kFloat);
  cache.page_table = at::tensor({7, 0, 0, 1, 2, 0, 3, 4, 5}, at::kInt).view({3, 3});
  cache.lengths = at::tensor({3, 6, 12}, at::kInt);
  AttentionSpec spec;
  spec.masks.push_back(Mask::causal(CausalAlignment::bottom_right));
  spec.return_lse = true;
  result<AttentionOutput> want = [&] {
    c10::NoGradGuard no_grad;
    return attention(packed, cache, spec);
  }();
  ASSERT_TRUE(want) << want.error().to_string();
  keel::c::AttentionSpec cspec;
  cspec.add(keel::c::mask(KEEL_MASK_CAUSAL, KEEL_ALIGN_BOTTOM_RIGHT));
  CTensor cq = dl(packed.q), cu = dl(packed.cu_seqlens_q), kp = dl(cache.k_pages),
          vp = dl(cache.v_pages), t = dl(cache.page_table), l = dl(cache.lengths);
  keel::c::Result<keel::c::AttentionResult> got =
      plugin().attention_packed_paged(cq, cu, kp, vp, t, l, cspec.get(), true);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_TRUE(bitwise(from(got.value().out), want.value().out));
  EXPECT_TRUE(bitwise(from(got.value().lse), want.value().lse));
}

TEST(CApiConformance, LogsumexpEqualsV1Bitwise) {
  at::manual_seed(13);
  const at::Tensor x = randn({3, 7}, at::kFloat), mask = at::rand({3, 7}) > 0.4;
  LogsumexpOptions o;
  o.dim = 1;
  o.mask = mask;
  result<LogsumexpOutput> want = logsumexp(x, o);
  ASSERT_TRUE(want);
  CTensor cx = dl(x), cm = dl(mask);
  keel::c::Result<CTensor> got = plugin().logsumexp(cx, 1, false, cm);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_TRUE(bitwise(from(got.value()), want.value().value));
}

TEST(CApiConformance, LossForwardBackwardEqualsV1Bitwise) {
  at::manual_seed(14);
  const at::Tensor h = randn({6, 16}, at::kFloat), w = randn({40, 16}, at::kFloat),
                   b = randn({40}, at::kFloat);
  const at::Tensor target = at::tensor({3, -100, 39, 0, 7, -100}, at::kLong);
  LinearCrossEntropyOptions o;
  o.label_smoothing = 0.1;
  o.return_per_token_loss = o.return_lse = true;
  const at::Tensor hg = h.clone().requires_grad_(), wg = w.clone().requires_grad_(),
                   bg = b.clone().requires_grad_();
  o.bias = bg;
  result<LossOutput> want = linear_cross_entropy(hg, wg, target, o);
  ASSERT_TRUE(want) << want.error().to_string();
  want.value().loss.backward();
  CTensor ch = dl(h), cw = dl(w), cb = dl(b), ct = dl(target);
  auto co = keel::c::make_args<KEEL_LinearCrossEntropy_Options>();
  co.label_smoothing = 0.1;
  co.bias = cb.get();
  co.return_per_token_loss = co.return_lse = 1;
  keel::c::Result<keel::c::LossResult> got = plugin().loss_forward_backward(ch, cw, ct, &co);
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_TRUE(bitwise(from(got.value().loss), want.value().loss.detach()));
  EXPECT_TRUE(bitwise(from(got.value().per_token_loss), want.value().per_token_loss.detach()));
  EXPECT_TRUE(bitwise(from(got.value().lse), want.value().lse.detach()));
  EXPECT_TRUE(bitwise(from(got.value().dhidden), hg.grad()));
  EXPECT_TRUE(bitwise(from(got.value().dweight), wg.grad()));
  EXPECT_TRUE(bitwise(from(got.value().dbias), bg.grad()));
  keel::c::Result<keel::c::LossResult> fwd = plugin().loss_forward(ch, cw, ct, &co);
  ASSERT_TRUE(fwd) << fwd.error().message();
  EXPECT_TRUE(bitwise(from(fwd.value().loss), want.value().loss.detach()));
}

// An input is read where it lies: the plugin's tensor is the caller's memory.
struct CLayout {
  const char* name;
  std::function<at::Tensor(const at::Tensor&)> lay;  // the same values in another layout
};

class CApiLayout : public ::testing::TestWithParam<CLayout> {};

// q, k and v in each layout a DLPack caller may pass, on the decode route
// (Lq = 3 and 6, 8 query heads over 1 and 2 kv heads) and on a dense call
// (Lq = Lk = 24): the C ABI's output is the float64 reference's within the
// suites' rule (keel/v1/attention.h's layout policy: read in place, or
// copied where the last dim is strided).
TEST_P(CApiLayout, AttentionMatchesTheFloat64Reference) {
  const CLayout& c = GetParam();
  const std::int64_t shapes[][3] = {{3, 21, 1}, {6, 6, 2}, {24, 24, 2}};  // Lq, Lk, Hkv
  for (const auto& [lq, lk, hkv] : shapes) {
    SCOPED_TRACE("Lq " + std::to_string(lq) + ", Lk " + std::to_string(lk));
    at::manual_seed(testing::kSeed);
    const attention_suite::Qkv x{c.lay(randn({2, 8, lq, 32}, at::kFloat)),
                                 c.lay(randn({2, hkv, lk, 32}, at::kFloat)),
                                 c.lay(randn({2, hkv, lk, 32}, at::kFloat))};
    AttentionSpec spec;
    spec.masks.push_back(Mask::causal(CausalAlignment::bottom_right));
    keel::c::AttentionSpec cspec;
    cspec.add(keel::c::mask(KEEL_MASK_CAUSAL, KEEL_ALIGN_BOTTOM_RIGHT));
    CTensor cq = dl(x.q), ck = dl(x.k), cv = dl(x.v);
    keel::c::Result<keel::c::AttentionResult> got =
        plugin().attention(cq, ck, cv, cspec.get(), false);
    ASSERT_TRUE(got) << got.error().message();
    AttentionOutput out;
    out.out = from(got.value().out);
    attention_suite::expect_within_rule(x, spec, out, 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CApiLayout,
    ::testing::Values(
        CLayout{"last_dim_stride_2",
                [](const at::Tensor& t) {
                  at::Tensor buf = at::zeros({t.size(0), t.size(1), t.size(2), t.size(3), 2});
                  buf.select(-1, 0).copy_(t);
                  return buf.select(-1, 0);
                }},
        CLayout{"last_two_transposed",
                [](const at::Tensor& t) { return t.transpose(2, 3).contiguous().transpose(2, 3); }},
        CLayout{"b_l_h_e",
                [](const at::Tensor& t) { return t.transpose(1, 2).contiguous().transpose(1, 2); }},
        CLayout{"fused_qkv_slice",
                [](const at::Tensor& t) {
                  at::Tensor buf = at::randn({t.size(0), t.size(1), t.size(2), 3 * t.size(3)});
                  buf.narrow(-1, t.size(3), t.size(3)).copy_(t);
                  return buf.narrow(-1, t.size(3), t.size(3));
                }},
        CLayout{"storage_offset",
                [](const at::Tensor& t) {
                  at::Tensor buf = at::randn({t.numel() + 5});
                  at::Tensor view = buf.narrow(0, 5, t.numel()).view(t.sizes());
                  view.copy_(t);
                  return view;
                }},
        CLayout{"broadcast_batch",
                [](const at::Tensor& t) { return t.narrow(0, 0, 1).expand(t.sizes()); }}),
    [](const ::testing::TestParamInfo<CLayout>& info) { return std::string(info.param.name); });

TEST(CApiConformance, InputsAreReadInPlace) {
  const at::Tensor x = at::arange(24, at::kFloat).view({2, 3, 4}).transpose(1, 2);
  DLManagedTensorVersioned* m = at::toDLPackVersioned(x);
  result<at::Tensor> t = c_api::from_dlpack(m, "x");
  ASSERT_TRUE(t);
  EXPECT_EQ(t.value().data_ptr(), x.data_ptr());
  EXPECT_EQ(t.value().strides(), x.strides());
  EXPECT_TRUE(at::equal(t.value(), x));
  m->deleter(m);
}

// Inputs in read-only memory (the caller's DLPack read-only flag, enforced
// here by the MMU): keel reads them and never writes.
TEST(CApiConformance, ReadOnlyInputsAreNeverWritten) {
  const long page = sysconf(_SC_PAGESIZE);
  const std::size_t n = 2 * 2 * 8 * 16;
  const std::size_t bytes = ((3 * n * sizeof(float) + page - 1) / page) * page;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  at::manual_seed(15);
  const at::Tensor all = at::from_blob(mem, {3, 2, 2, 8, 16}, at::kFloat);
  all.copy_(at::randn({3, 2, 2, 8, 16}));
  const at::Tensor copy = all.clone();
  ASSERT_EQ(mprotect(mem, bytes, PROT_READ), 0);
  const DLDataType f32{kDLFloat, 32, 1};
  const float* base = static_cast<const float*>(mem);
  CTensor q = CTensor::view(base, f32, {2, 2, 8, 16}, true),
          k = CTensor::view(base + n, f32, {2, 2, 8, 16}, true),
          v = CTensor::view(base + 2 * n, f32, {2, 2, 8, 16}, true);
  keel::c::AttentionSpec spec;
  spec.add(keel::c::mask(KEEL_MASK_CAUSAL));
  keel::c::Result<keel::c::AttentionResult> r = plugin().attention(q, k, v, spec.get(), true);
  ASSERT_TRUE(r) << r.error().message();
  AttentionSpec v1;
  v1.masks.push_back(Mask::causal());
  result<AttentionOutput> want = attention(copy[0], copy[1], copy[2], v1);
  ASSERT_TRUE(want);
  EXPECT_TRUE(bitwise(from(r.value().out), want.value().out));
  EXPECT_TRUE(at::equal(all, copy));
  munmap(mem, bytes);
}

// The struct-size rule: a newer caller's larger struct is accepted (its
// appended fields ignored), a struct is read only up to its size, and one
// smaller than its first release's is invalid_argument.
TEST(CApiConformance, StructSizesFromOlderAndNewerCallers) {
  const at::Tensor x = randn({2, 5}, at::kFloat);
  CTensor cx = dl(x);
  struct Newer {
    KEEL_Logsumexp_Args args;
    double appended_field;
  } newer;
  std::memset(&newer, 0, sizeof newer);
  newer.args.struct_size = sizeof newer;
  newer.args.input = cx.get();
  newer.args.dim = 1;
  newer.appended_field = 1e300;
  const KEEL_Api* api = plugin().api();
  ASSERT_EQ(api->KEEL_Logsumexp(&newer.args), nullptr);
  CTensor value = CTensor::adopt(newer.args.value);
  EXPECT_TRUE(bitwise(from(value), at::logsumexp(x, 1)));

  // A caller's struct of exactly 1.0's size: whatever lies past it (here
  // 0xff bytes) is never read. One smaller than 1.0's is invalid_argument.
  struct {
    KEEL_AttentionSpec spec;
    unsigned char past[64];
  } older;
  std::memset(&older, 0xff, sizeof older);
  KEEL_AttentionSpec& spec = older.spec;
  std::memset(&spec, 0, KEEL_STRUCT_SIZE(KEEL_AttentionSpec, backend));
  spec.struct_size = KEEL_STRUCT_SIZE(KEEL_AttentionSpec, backend);
  const at::Tensor q = randn({1, 1, 3, 4}, at::kFloat);
  CTensor cq = dl(q);
  KEEL_Attention_Forward_Args fa;
  std::memset(&fa, 0, sizeof fa);
  fa.struct_size = sizeof fa;
  fa.q = fa.k = fa.v = cq.get();
  fa.spec = &spec;
  KEEL_Error* e = api->KEEL_Attention_Forward(&fa);
  ASSERT_EQ(e, nullptr);
  CTensor out = CTensor::adopt(fa.out);
  result<AttentionOutput> want = attention(q, q, q);
  ASSERT_TRUE(want);
  EXPECT_TRUE(bitwise(from(out), want.value().out));
  spec.struct_size = KEEL_STRUCT_SIZE(KEEL_AttentionSpec, bias);
  e = api->KEEL_Attention_Forward(&fa);
  ASSERT_NE(e, nullptr);
  KEEL_Error_GetCode_Args code;
  std::memset(&code, 0, sizeof code);
  code.struct_size = sizeof code;
  code.error = e;
  api->KEEL_Error_GetCode(&code);
  EXPECT_EQ(code.code, KEEL_ERRC_INVALID_ARGUMENT);
  KEEL_Error_Destroy_Args destroy{sizeof(KEEL_Error_Destroy_Args), nullptr, e};
  api->KEEL_Error_Destroy(&destroy);
}

// 1.0's rule that a zeroed struct is the defaults: zeroed loss options
// ignore -100, as NULL options do, and keep class 0 (a zeroed
// `ignore_index` of 0 would drop it).
TEST(CApiConformance, ZeroedOptionsAreTheDefaults) {
  const at::Tensor h = randn({6, 8}, at::kDouble), w = randn({5, 8}, at::kDouble);
  const at::Tensor target = at::tensor({0, 0, 3, -100, 4, 0}, at::kLong);
  CTensor ch = dl(h), cw = dl(w), ct = dl(target);
  const auto zeroed = keel::c::make_args<KEEL_LinearCrossEntropy_Options>();
  keel::c::Result<keel::c::LossResult> with_zeroed = plugin().loss_forward(ch, cw, ct, &zeroed);
  keel::c::Result<keel::c::LossResult> with_null = plugin().loss_forward(ch, cw, ct, nullptr);
  ASSERT_TRUE(with_zeroed) << with_zeroed.error().message();
  ASSERT_TRUE(with_null) << with_null.error().message();
  const at::Tensor want =
      at::cross_entropy_loss(at::matmul(h, w.t()), target, {}, at::Reduction::Mean, -100);
  const at::Tensor zeroed_loss = from(with_zeroed.value().loss);
  EXPECT_TRUE(bitwise(zeroed_loss, from(with_null.value().loss)));
  EXPECT_NEAR(zeroed_loss.item<double>(), want.item<double>(), 1e-12);
  auto explicit_zero = zeroed;
  explicit_zero.has_ignore_index = 1;
  explicit_zero.ignore_index = 0;
  const at::Tensor classes = target.masked_fill(target == -100, 1);  // 0 is now the ignored one
  CTensor cc = dl(classes);
  keel::c::Result<keel::c::LossResult> dropped = plugin().loss_forward(ch, cw, cc, &explicit_zero);
  ASSERT_TRUE(dropped) << dropped.error().message();
  const at::Tensor want_dropped =
      at::cross_entropy_loss(at::matmul(h, w.t()), classes, {}, at::Reduction::Mean, 0);
  EXPECT_NEAR(from(dropped.value().loss).item<double>(), want_dropped.item<double>(), 1e-12);
}

// Outputs on error: every output field of the caller's struct is NULL
// (whatever it held before), and nothing was handed over.
TEST(CApiConformance, OutputsAreZeroOnError) {
  const at::Tensor q = randn({1, 2, 3, 4}, at::kFloat), k = randn({1, 2, 3, 5}, at::kFloat);
  CTensor cq = dl(q), ck = dl(k);
  auto a = keel::c::make_args<KEEL_Attention_Forward_Args>();
  a.q = cq.get();
  a.k = ck.get();  // E differs from q's: v1 refuses it after the inputs are read
  a.v = ck.get();
  a.return_lse = 1;
  static DLManagedTensorVersioned stale{};
  a.out = a.lse = &stale;
  a.served_backend = 42;
  KEEL_Error* e = plugin().api()->KEEL_Attention_Forward(&a);
  keel::c::Error error;
  ASSERT_TRUE(keel::c::take_error(plugin().api(), e, error));
  EXPECT_EQ(error.code(), KEEL_ERRC_INVALID_ARGUMENT);
  EXPECT_EQ(a.out, nullptr);
  EXPECT_EQ(a.lse, nullptr);
  EXPECT_EQ(a.served_backend, 0);
}

// A plugin writes only inside the caller's struct: the bytes after it (its
// tail padding and beyond) keep the caller's canary on success and error.
TEST(CApiConformance, OutputsStayInsideTheCallersStruct) {
  const at::Tensor x = randn({2, 5}, at::kFloat);
  CTensor cx = dl(x);
  struct {
    KEEL_Logsumexp_Args args;
    unsigned char canary[64];
  } call;
  std::memset(&call, 0xa5, sizeof call);
  std::memset(&call.args, 0, KEEL_Logsumexp_Args_STRUCT_SIZE);
  call.args.struct_size = KEEL_Logsumexp_Args_STRUCT_SIZE;
  call.args.input = cx.get();
  call.args.dim = 1;
  ASSERT_EQ(plugin().api()->KEEL_Logsumexp(&call.args), nullptr);
  CTensor value = CTensor::adopt(call.args.value);
  EXPECT_TRUE(bitwise(from(value), at::logsumexp(x, 1)));
  const auto* bytes = reinterpret_cast<const unsigned char*>(&call);
  for (std::size_t i = KEEL_Logsumexp_Args_STRUCT_SIZE; i < sizeof call; ++i) {
    ASSERT_EQ(bytes[i], 0xa5) << "byte " << i << " past the caller's struct was written";
  }
}

// The mechanism behind it (plugin/common.h): an output whose field an
// older caller's struct does not have is freed, not written; the others are
// handed over together at commit, and freed when the call fails first.
TEST(CApiConformance, OutputsAreHandedOverOnlyWhereTheCallerHasTheField) {
  struct Args {
    std::size_t struct_size;
    DLManagedTensorVersioned* first;
    std::int32_t code;
    DLManagedTensorVersioned* appended;  // a field a later minor added
  };
  int freed = 0;
  struct Owned {
    DLManagedTensorVersioned managed{};
    int* freed;
  };
  const auto make = [&freed] {
    auto* o = new Owned{};
    o->freed = &freed;
    o->managed.manager_ctx = o;
    o->managed.deleter = [](DLManagedTensorVersioned* self) {
      auto* owner = static_cast<Owned*>(self->manager_ctx);
      ++*owner->freed;
      delete owner;
    };
    return &o->managed;
  };
  Args older{};
  older.struct_size = offsetof(Args, appended);  // built before `appended` existed
  older.code = 7;
  {
    c_api::Outputs<Args> out(&older, &Args::first, &Args::code, &Args::appended);
    EXPECT_EQ(older.code, 0);  // zeroed at entry, inside the struct
    out.tensor(&Args::first, make());
    out.tensor(&Args::appended, make());
    out.set(&Args::code, 3);
    EXPECT_EQ(older.first, nullptr);  // nothing is handed over before commit
    out.commit();
  }
  EXPECT_EQ(freed, 1);  // `appended`: freed, never written
  EXPECT_EQ(older.code, 3);
  ASSERT_NE(older.first, nullptr);
  older.first->deleter(older.first);
  EXPECT_EQ(freed, 2);
  Args failed{};
  failed.struct_size = sizeof failed;
  {
    c_api::Outputs<Args> out(&failed, &Args::first, &Args::code, &Args::appended);
    out.tensor(&Args::first, make());
    out.tensor(&Args::appended, make());
  }  // no commit: the call failed
  EXPECT_EQ(freed, 4);
  EXPECT_EQ(failed.first, nullptr);
  EXPECT_EQ(failed.appended, nullptr);
}

// Destroy and abort read their struct's size too: a struct too small is an
// error value, and the handle is left alone.
TEST(CApiConformance, DestroyAndAbortReadTheirSize) {
  const KEEL_Api* api = plugin().api();
  KEEL_Comm_Destroy_Args destroy{};
  destroy.struct_size = 4;
  keel::c::Error error;
  ASSERT_TRUE(keel::c::take_error(api, api->KEEL_Comm_Destroy(&destroy), error));
  EXPECT_EQ(error.code(), KEEL_ERRC_INVALID_ARGUMENT);
  EXPECT_NE(error.message().find("struct_size"), std::string::npos) << error.message();
  KEEL_Work_Destroy_Args work{};
  work.struct_size = 4;
  ASSERT_TRUE(keel::c::take_error(api, api->KEEL_Work_Destroy(&work), error));
  EXPECT_EQ(error.code(), KEEL_ERRC_INVALID_ARGUMENT);
  KEEL_Comm_Abort_Args abort_args{};
  abort_args.struct_size = 4;
  ASSERT_TRUE(keel::c::take_error(api, api->KEEL_Comm_Abort(&abort_args), error));
  EXPECT_EQ(error.code(), KEEL_ERRC_INVALID_ARGUMENT);
  ASSERT_TRUE(keel::c::take_error(api, api->KEEL_Comm_Destroy(nullptr), error));
  EXPECT_EQ(error.code(), KEEL_ERRC_INVALID_ARGUMENT);
  auto none = keel::c::make_args<KEEL_Comm_Destroy_Args>();  // a NULL handle: nothing to free
  EXPECT_EQ(api->KEEL_Comm_Destroy(&none), nullptr);
}

struct BadCall {
  const char* name;
  std::function<KEEL_Error*(const KEEL_Api*, CTensor&)> call;
  std::int32_t code;
  const char* names;  // what the message must name
};

class CApiBadInput : public ::testing::TestWithParam<BadCall> {};

TEST_P(CApiBadInput, IsAnErrorValueNamingTheArgument) {
  const BadCall& c = GetParam();
  CTensor x = dl(randn({1, 2, 3, 4}, at::kFloat));
  KEEL_Error* e = c.call(plugin().api(), x);
  ASSERT_NE(e, nullptr);
  const KEEL_Api* api = plugin().api();
  KEEL_Error_GetCode_Args code{sizeof(KEEL_Error_GetCode_Args), nullptr, e, 0};
  api->KEEL_Error_GetCode(&code);
  KEEL_Error_Message_Args msg{sizeof(KEEL_Error_Message_Args), nullptr, e, nullptr, 0};
  api->KEEL_Error_Message(&msg);
  EXPECT_EQ(code.code, c.code) << msg.message;
  EXPECT_NE(std::string(msg.message).find(c.names), std::string::npos) << msg.message;
  KEEL_Error_Destroy_Args destroy{sizeof(KEEL_Error_Destroy_Args), nullptr, e};
  api->KEEL_Error_Destroy(&destroy);
}

KEEL_Attention_Forward_Args forward_args(CTensor& x) {
  KEEL_Attention_Forward_Args a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.q = a.k = a.v = x.get();
  return a;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CApiBadInput,
    ::testing::Values(
        BadCall{"null_args",
                [](const KEEL_Api* api, CTensor&) { return api->KEEL_Attention_Forward(nullptr); },
                KEEL_ERRC_INVALID_ARGUMENT, "is NULL"},
        BadCall{"struct_size_zero",
                [](const KEEL_Api* api, CTensor& x) {
                  KEEL_Attention_Forward_Args a = forward_args(x);
                  a.struct_size = 0;
                  return api->KEEL_Attention_Forward(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "struct_size"},
        BadCall{"null_q",
                [](const KEEL_Api* api, CTensor& x) {
                  KEEL_Attention_Forward_Args a = forward_args(x);
                  a.q = nullptr;
                  return api->KEEL_Attention_Forward(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "q: is NULL"},
        BadCall{"dlpack_major_2",
                [](const KEEL_Api* api, CTensor& x) {
                  KEEL_Attention_Forward_Args a = forward_args(x);
                  x.get()->version.major = 2;
                  return api->KEEL_Attention_Forward(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "DLPack 2."},
        BadCall{"dtype_lanes",
                [](const KEEL_Api* api, CTensor& x) {
                  KEEL_Attention_Forward_Args a = forward_args(x);
                  x.get()->dl_tensor.dtype.lanes = 4;
                  return api->KEEL_Attention_Forward(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "lanes 4"},
        BadCall{
            "negative_size",
            [](const KEEL_Api* api, CTensor& x) {
              // DLPack 1.0's shape is const: a view of our own.
              static const float data[1] = {};
              static CTensor bad = CTensor::view(data, DLDataType{kDLFloat, 32, 1}, {1, -2, 3, 4});
              KEEL_Attention_Forward_Args a = forward_args(x);
              a.q = bad.get();
              return api->KEEL_Attention_Forward(&a);
            },
            KEEL_ERRC_INVALID_ARGUMENT, "negative size"},
        BadCall{"cuda_tensor_on_cpu_plugin",
                [](const KEEL_Api* api, CTensor& x) {
                  KEEL_Attention_Forward_Args a = forward_args(x);
                  x.get()->dl_tensor.device.device_type = kDLCUDA;
                  return api->KEEL_Attention_Forward(&a);
                },
                KEEL_ERRC_UNSUPPORTED, "CUDA"},
        BadCall{"stream_for_cpu",
                [](const KEEL_Api* api, CTensor& x) {
                  KEEL_Attention_Forward_Args a = forward_args(x);
                  a.stream = &a;
                  return api->KEEL_Attention_Forward(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "stream"},
        BadCall{"mask_kind_out_of_range",
                [](const KEEL_Api* api, CTensor& x) {
                  KEEL_Attention_Forward_Args a = forward_args(x);
                  static KEEL_Mask m = keel::c::mask(KEEL_MASK_CAUSAL);
                  m.kind = 99;
                  static const KEEL_Mask* list[] = {&m};
                  static KEEL_AttentionSpec s;
                  std::memset(&s, 0, sizeof s);
                  s.struct_size = sizeof s;
                  s.masks = list;
                  s.num_masks = 1;
                  a.spec = &s;
                  return api->KEEL_Attention_Forward(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "spec.masks[0].kind"},
        BadCall{"v1_validation_crosses",
                [](const KEEL_Api* api, CTensor& x) {
                  KEEL_Attention_Forward_Args a = forward_args(x);
                  static CTensor k = dl(at::randn({1, 2, 3, 5}));
                  a.k = k.get();
                  return api->KEEL_Attention_Forward(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "attention"},
        BadCall{"loss_reduction_out_of_range",
                [](const KEEL_Api* api, CTensor& x) {
                  KEEL_LinearCrossEntropy_Forward_Args a;
                  std::memset(&a, 0, sizeof a);
                  a.struct_size = sizeof a;
                  a.hidden = a.weight = a.target = x.get();
                  static KEEL_LinearCrossEntropy_Options o;
                  std::memset(&o, 0, sizeof o);
                  o.struct_size = sizeof o;
                  o.reduction = 7;
                  a.options = &o;
                  return api->KEEL_LinearCrossEntropy_Forward(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "options.reduction"},
        BadCall{"collective_without_comm",
                [](const KEEL_Api* api, CTensor& x) {
                  auto a = keel::c::make_args<KEEL_Comm_AllReduce_Args>();
                  a.tensor = x.get();
                  return api->KEEL_Comm_AllReduce(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "comm is NULL"},
        BadCall{"comm_bad_backend",
                [](const KEEL_Api* api, CTensor&) {
                  auto a = keel::c::make_args<KEEL_Comm_Create_Args>();
                  a.backend = 5;
                  return api->KEEL_Comm_Create(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "KEEL_CommBackend"},
        BadCall{"compat_record_without_function",
                [](const KEEL_Api* api, CTensor&) {
                  KEEL_Compat_Record_Args a = keel::c::make_args<KEEL_Compat_Record_Args>();
                  a.path = "/tmp/unused.safetensors";
                  return api->KEEL_Compat_Record(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "function"},
        BadCall{"unknown_backend",
                [](const KEEL_Api* api, CTensor& x) {
                  KEEL_Logsumexp_Args a;
                  std::memset(&a, 0, sizeof a);
                  a.struct_size = sizeof a;
                  a.input = x.get();
                  a.backend = 9;
                  return api->KEEL_Logsumexp(&a);
                },
                KEEL_ERRC_INVALID_ARGUMENT, "backend"}),
    [](const ::testing::TestParamInfo<BadCall>& info) { return std::string(info.param.name); });

// keel::compat over a C callback: a service function recorded and replayed;
// the same function passes, a token id off by one fails (integers exactly),
// an error the callback returns is the case's error.
struct CompatService {
  std::int64_t bump = 0;
  std::int32_t fail = KEEL_ERRC_OK;
  at::Tensor logits, ids;
};

std::int32_t compat_function(KEEL_Compat_Function_Args* args) {
  auto& s = *static_cast<CompatService*>(args->user_data);
  if (s.fail != KEEL_ERRC_OK) {
    std::snprintf(args->error, args->error_capacity, "the service says no");
    return s.fail;
  }
  if (args->num_inputs != 1 || args->output_capacity < 2) return KEEL_ERRC_INVALID_ARGUMENT;
  const at::Tensor x = c_api::from_dlpack(args->inputs[0].tensor, "x").value();
  s.logits = (x * 2).to(at::kBFloat16);
  s.ids = at::arange(998, 1002, at::kLong);
  s.ids[2] += s.bump;
  args->outputs[0] = {"logits", at::toDLPackVersioned(s.logits)};
  args->outputs[1] = {"ids", at::toDLPackVersioned(s.ids)};
  args->num_outputs = 2;
  return KEEL_ERRC_OK;
}

TEST(CApiConformance, CompatRecordsAndComparesACallback) {
  const std::string path = ::testing::TempDir() + "keel-c-api-compat.safetensors";
  const at::Tensor x = at::randn({4});
  CTensor cx = dl(x);
  KEEL_NamedTensor input{"x", cx.get()};
  KEEL_Compat_Case c = keel::c::make_args<KEEL_Compat_Case>();
  c.id = "service/step";
  c.inputs = &input;
  c.num_inputs = 1;
  const KEEL_Compat_Case* cases[] = {&c};
  CompatService service;
  const KEEL_Api* api = plugin().api();
  KEEL_Compat_Record_Args rec = keel::c::make_args<KEEL_Compat_Record_Args>();
  rec.path = path.c_str();
  rec.cases = cases;
  rec.num_cases = 1;
  rec.function = &compat_function;
  rec.user_data = &service;
  keel::c::Error e;
  ASSERT_FALSE(keel::c::take_error(api, api->KEEL_Compat_Record(&rec), e)) << e.message();
  const auto compare = [&](std::int64_t bump, std::int32_t fail) {
    service.bump = bump;
    service.fail = fail;
    KEEL_Compat_Compare_Args cmp = keel::c::make_args<KEEL_Compat_Compare_Args>();
    cmp.path = path.c_str();
    cmp.function = &compat_function;
    cmp.user_data = &service;
    EXPECT_FALSE(keel::c::take_error(api, api->KEEL_Compat_Compare(&cmp), e)) << e.message();
    return cmp;
  };
  KEEL_Compat_Compare_Args same = compare(0, KEEL_ERRC_OK);
  EXPECT_EQ(same.passed, 1);
  KEEL_Compat_Compare_Args moved = compare(1, KEEL_ERRC_OK);
  EXPECT_EQ(moved.failed, 1);
  KEEL_Compat_Compare_Args declined = compare(0, KEEL_ERRC_UNSUPPORTED);
  EXPECT_EQ(declined.skipped, 1);
  KEEL_Compat_Compare_Args failing = compare(0, KEEL_ERRC_BACKEND_ERROR);
  EXPECT_EQ(failing.errors, 1);
  std::remove(path.c_str());
}

// ------------------------------------------------------------ the loader

std::string temp_file(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + "keel-c-api-" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct BadPlugin {
  const char* name;
  std::function<keel::c::LoadOptions()> options;
  std::int32_t code;
  const char* says;
};

class CApiLoader : public ::testing::TestWithParam<BadPlugin> {};

TEST_P(CApiLoader, RefusesWithTheReason) {
  keel::c::Result<keel::c::Plugin> r = keel::c::Plugin::load(GetParam().options());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), GetParam().code) << r.error().message();
  EXPECT_NE(r.error().message().find(GetParam().says), std::string::npos) << r.error().message();
}

keel::c::LoadOptions path_option(const std::string& path) {
  keel::c::LoadOptions o;
  o.plugin_path = path;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CApiLoader,
    ::testing::Values(
        BadPlugin{"missing_file", [] { return path_option("/nonexistent/libkeel-plugin.so"); },
                  KEEL_ERRC_IO_ERROR, "No such file"},
        BadPlugin{"not_elf", [] { return path_option(temp_file("text.so", "not a library\n")); },
                  KEEL_ERRC_CORRUPT_DATA, "not an ELF file"},
        BadPlugin{"truncated_plugin",
                  [] {
                    return path_option(
                        temp_file("truncated.so", read_all(KEEL_PLUGIN_FILE).substr(0, 4096)));
                  },
                  KEEL_ERRC_CORRUPT_DATA, "truncated"},
        BadPlugin{"a_library_that_is_no_plugin", [] { return path_option(KEEL_LOADER_FILE); },
                  KEEL_ERRC_CORRUPT_DATA, "not a keel plugin"},
        BadPlugin{"plugin_of_another_release",
                  [] {
                    std::string bytes = read_all(KEEL_PLUGIN_FILE);
                    const std::string from =
                        std::string("release=") + KEEL_TEST_TORCH_RELEASE + "\n";
                    std::string to = from;
                    to[8] = to[8] == '9' ? '8' : '9';  // 2.15.0 -> 9.15.0: same length
                    const auto at = bytes.find(from);
                    if (at != std::string::npos) bytes.replace(at, from.size(), to);
                    return path_option(temp_file("other-release.so", bytes));
                  },
                  KEEL_ERRC_UNSUPPORTED, "already runs libtorch " KEEL_TEST_TORCH_RELEASE},
        BadPlugin{"asked_release_differs",
                  [] {
                    keel::c::LoadOptions o = path_option(KEEL_PLUGIN_FILE);
                    o.torch_release = "1.13.0";
                    return o;
                  },
                  KEEL_ERRC_UNSUPPORTED, "not the 1.13.0 asked for"},
        BadPlugin{"no_plugin_for_release",
                  [] {
                    keel::c::LoadOptions o;
                    o.torch_release = "2.8.0";
                    o.plugin_dir = ::testing::TempDir();
                    return o;
                  },
                  KEEL_ERRC_IO_ERROR, "libkeel-plugin-2.8.0-cpu.so"}),
    [](const ::testing::TestParamInfo<BadPlugin>& info) { return std::string(info.param.name); });

// A process that already runs a libtorch shares it with the plugin: a
// torch_library_dir is then not opened, since a copy of libc10 opened by
// path would be a second one beside the process's (a path is not matched by
// soname).
TEST(CApiConformance, ALibtorchInTheProcessWinsOverTheFolder) {
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&c10::GetCPUAllocator), &info), 0);
  const std::string dir = ::testing::TempDir() + "keel-c-api-torch-lib";
  ASSERT_EQ(std::system(("mkdir -p '" + dir + "'").c_str()), 0);
  const std::string c10_copy = dir + "/libc10.so";
  std::ofstream(c10_copy, std::ios::binary) << read_all(info.dli_fname);
  keel::c::LoadOptions o = path_option(temp_file("same-release.so", read_all(KEEL_PLUGIN_FILE)));
  o.torch_library_dir = dir;
  keel::c::Result<keel::c::Plugin> r = keel::c::Plugin::load(o);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(dlopen(c10_copy.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr)
      << "a second libc10 was loaded from the folder";
}

TEST(CApiConformance, LoaderFindsThePluginByReleaseAndReturnsTheSameTable) {
  keel::c::LoadOptions o;
  o.torch_release = KEEL_TEST_TORCH_RELEASE;
  o.plugin_dir = KEEL_PLUGIN_DIR;
  keel::c::Result<keel::c::Plugin> r = keel::c::Plugin::load(o);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_EQ(r.value().api(), plugin().api());
  KEEL_LoadOptions small;
  std::memset(&small, 0, sizeof small);
  small.struct_size = 8;
  EXPECT_EQ(keel_load_plugin(&small), KEEL_ERRC_INVALID_ARGUMENT);
  EXPECT_EQ(keel_load_plugin(nullptr), KEEL_ERRC_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace keel
