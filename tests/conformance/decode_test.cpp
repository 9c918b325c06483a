// Decode, speculative verification and chunked prefill against a
// contiguous cache, on every adapter of this build, against the float64
// reference: forward (at the test's thread count and at one thread, where
// keel's fused decode kernel serves) and gradients. The paged cache's
// conformance is beside it (paged_attention_test.cpp), the packed ragged
// queries' in packed_attention_test.cpp.
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "conformance/adapters.h"
#include "conformance/attention_support.h"
#include "reference/attention_reference.h"

namespace keel {
namespace {

using namespace attention_suite;  // NOLINT(google-build-using-namespace): the suite's own helpers

// Decode and speculative verification (a few queries, Lq <= 16) and chunked
// prefill (Lq = 128 < Lk) against a cache, grouped-query heads, every mask a
// service uses, narrow caches. One named case per shape; each seeds its own
// inputs.
struct DecodeCase {
  const char* name;
  Shape shape;
  at::ScalarType dtype;
  std::function<AttentionSpec(const Shape&)> spec;
};

const std::vector<DecodeCase>& decode_cases() {
  static const std::vector<DecodeCase> cases = {
      {"gqa32_8_lq1_causal_bottom_right", decode_shape(2, 32, 8, 1, 600, 128, 128), at::kFloat,
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
      {"gqa32_8_lq1_no_mask", decode_shape(1, 32, 8, 1, 777, 128, 128), at::kFloat,
       [](const Shape&) { return AttentionSpec{}; }},
      {"gqa32_1_lq5_window", decode_shape(2, 32, 1, 5, 900, 80, 80), at::kFloat,
       [](const Shape&) {
         return with_masks({Mask::sliding_window(100, 0, CausalAlignment::bottom_right)});
       }},
      {"gqa32_8_lq1_ragged_lengths", decode_shape(4, 32, 8, 1, 700, 128, 128), at::kFloat,
       [](const Shape&) {
         return with_masks({Mask::causal(CausalAlignment::bottom_right),
                            Mask::key_padding(at::tensor({0, 1, 256, 700}, at::kLong))});
       }},
      {"gqa32_8_lq5_documents", decode_shape(2, 32, 8, 5, 640, 128, 128), at::kFloat,
       [](const Shape& s) {
         const at::Tensor kv =
             at::div(at::arange(s.Lk, at::kLong), 300, "floor").expand({s.B, s.Lk});
         const at::Tensor q = kv.narrow(1, s.Lk - s.Lq, s.Lq).contiguous();
         return with_masks(
             {Mask::document(q, kv.contiguous()), Mask::causal(CausalAlignment::bottom_right)});
       }},
      {"gqa4_2_lq16_window_ev_ne_e", decode_shape(2, 4, 2, 16, 500, 64, 48), at::kFloat,
       [](const Shape&) {
         return with_masks({Mask::sliding_window(40, 0, CausalAlignment::bottom_right)});
       }},
      {"gqa32_8_lq1_softcap_alibi_bias", decode_shape(2, 32, 8, 1, 300, 128, 128), at::kFloat,
       [](const Shape& s) {
         AttentionSpec spec = with_masks({Mask::causal(CausalAlignment::bottom_right)});
         spec.softcap = 5.0;
         spec.alibi_slopes = at::linspace(0.01, 0.5, s.Hq, at::kFloat);
         spec.alibi_alignment = CausalAlignment::bottom_right;
         spec.bias = at::randn({s.B, 1, s.Lq, s.Lk});
         return spec;
       }},
      {"gqa32_8_lq1_bf16_window", decode_shape(2, 32, 8, 1, 3000, 128, 128), at::kBFloat16,
       [](const Shape&) {
         return with_masks({Mask::sliding_window(512, 0, CausalAlignment::bottom_right)});
       }},
      // A 16-bit group of few rows (2 x 3) runs in the kernel's own
      // grouped-query layout, its mask over query heads.
      {"gqa8_4_lq3_f16_masked_heads_layout", decode_shape(2, 8, 4, 3, 500, 64, 64), at::kHalf,
       [](const Shape&) {
         return with_masks({Mask::causal(CausalAlignment::bottom_right),
                            Mask::key_padding(at::tensor({500, 321}, at::kLong))});
       }},
      {"gqa32_8_lq5_bf16_ragged", decode_shape(3, 32, 8, 5, 2100, 128, 128), at::kBFloat16,
       [](const Shape&) {
         return with_masks({Mask::causal(CausalAlignment::bottom_right),
                            Mask::key_padding(at::tensor({2100, 5, 1030}, at::kLong))});
       }},
      // keel's fused kernel (kernels/fused_decode.h): each query's own
      // interval of keys (causal, a window, a length per sequence), 10 rows
      // per kv head; 16 rows of head dim 80 over one kv head, its keys split
      // into runs merged by log-sum-exp; bfloat16 with Ev != E.
      {"gqa8_4_lq5_fused_row_intervals", decode_shape(2, 8, 4, 5, 2000, 128, 128), at::kFloat,
       [](const Shape&) {
         return with_masks({Mask::causal(CausalAlignment::bottom_right),
                            Mask::sliding_window(300, 0, CausalAlignment::bottom_right),
                            Mask::key_padding(at::tensor({2000, 1003}, at::kLong))});
       }},
      {"gqa16_1_lq1_fused_runs_e80", decode_shape(1, 16, 1, 1, 3000, 80, 80), at::kFloat,
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
      {"gqa8_2_lq3_fused_bf16_ev_ne_e", decode_shape(2, 8, 2, 3, 1500, 64, 32), at::kBFloat16,
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
      // Multi-query bfloat16: 32 rows over one kv head, the fused kernel's
      // most, and a sequence of 17 keys (one full block and one key).
      {"gqa32_1_lq1_fused_bf16_32_rows", decode_shape(2, 32, 1, 1, 1800, 128, 128), at::kBFloat16,
       [](const Shape&) {
         return with_masks({Mask::causal(CausalAlignment::bottom_right),
                            Mask::key_padding(at::tensor({1800, 17}, at::kLong))});
       }},
      // float32 multi-query: 32 rows take the fused kernel over a short range
      // (sequence 1, 700 keys) and keel's GEMMs over a long one (sequence 0).
      {"gqa32_1_lq1_fused_f32_short_range", decode_shape(2, 32, 1, 1, 1500, 128, 128), at::kFloat,
       [](const Shape&) {
         return with_masks({Mask::causal(CausalAlignment::bottom_right),
                            Mask::key_padding(at::tensor({1500, 700}, at::kLong))});
       }},
      // Documents on the fused kernel: a query's document whose keys are one
      // run is an interval (sequence 0, packed in order); a document in
      // pieces (sequence 1) takes the block classifier; a document with no
      // key (sequence 2) is a row that sees nothing.
      {"gqa32_8_lq1_fused_bf16_documents", decode_shape(3, 32, 8, 1, 2500, 128, 128), at::kBFloat16,
       [](const Shape& s) {
         const at::Tensor j = at::arange(s.Lk, at::kLong);
         const at::Tensor kv =
             at::stack({at::div(j, 700, "floor"), at::remainder(at::div(j, 100, "floor"), 3),
                        at::div(j, 700, "floor")});
         const at::Tensor q = at::tensor({3, 0, 9}, at::kLong).view({s.B, s.Lq});
         return with_masks({Mask::document(q, kv), Mask::causal(CausalAlignment::bottom_right)});
       }},
      // Rows of one call in different documents (queries 1197.. see documents
      // 1, 2, 2 in sequence 0; 2, 2, 3 in sequence 1): each row its own
      // interval, 6 rows per kv head.
      {"gqa8_4_lq3_fused_documents_across_rows", decode_shape(2, 8, 4, 3, 1200, 64, 64), at::kFloat,
       [](const Shape& s) {
         const at::Tensor j = at::arange(s.Lk, at::kLong);
         const at::Tensor kv = at::stack({at::div(j, 599, "floor"), at::div(j + 1, 400, "floor")});
         const at::Tensor q = kv.narrow(1, s.Lk - s.Lq, s.Lq).contiguous();
         return with_masks({Mask::document(q, kv), Mask::causal(CausalAlignment::bottom_right)});
       }},
      // Chunked prefill (Lq < Lk): the flash kernel, masked over the visible keys.
      {"gqa32_8_lq128_prefill_window", decode_shape(2, 32, 8, 128, 1500, 128, 128), at::kFloat,
       [](const Shape&) {
         return with_masks({Mask::sliding_window(300, 0, CausalAlignment::bottom_right)});
       }},
      {"gqa32_8_lq128_prefill_rows_that_see_nothing", decode_shape(2, 32, 8, 128, 700, 64, 64),
       at::kFloat,
       [](const Shape& s) {
         // Keys of documents 0 and 1; queries 64.. ask for document 7, which has none.
         const at::Tensor kv =
             at::div(at::arange(s.Lk, at::kLong), 350, "floor").expand({s.B, s.Lk});
         const at::Tensor q = at::where(at::arange(s.Lq, at::kLong) < 64, 1, 7).expand({s.B, s.Lq});
         return with_masks({Mask::document(q.contiguous(), kv.contiguous()),
                            Mask::causal(CausalAlignment::bottom_right)});
       }},
      {"gqa32_8_lq128_prefill_bf16_causal", decode_shape(1, 32, 8, 128, 2000, 128, 128),
       at::kBFloat16,
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
      // Causal prefill without autograd splits each block's keys: those every
      // query sees run unmasked, the diagonal masked, merged by log-sum-exp
      // (two query blocks here, of 128 and 72 rows).
      {"gqa32_8_lq200_prefill_causal_split", decode_shape(1, 32, 8, 200, 1200, 64, 64), at::kFloat,
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
      // Per sequence: length 900 splits off its diagonal; length 700 hides the
      // diagonal, so every key left is seen by every query (an unmasked piece
      // alone).
      {"gqa4_1_lq64_prefill_padding_causal_split", decode_shape(2, 4, 1, 64, 900, 64, 64),
       at::kFloat,
       [](const Shape&) {
         return with_masks({Mask::causal(CausalAlignment::bottom_right),
                            Mask::key_padding(at::tensor({900, 700}, at::kLong))});
       }},
      {"gqa32_8_lq1_float64", decode_shape(2, 32, 8, 1, 300, 128, 128), at::kDouble,
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
  };
  return cases;
}

class DecodeConformance : public AdapterAndCase {
 protected:
  const DecodeCase& the_case() const { return case_named(decode_cases(), case_name()); }
  AttentionOutput run(const Qkv& x, AttentionSpec spec) const {
    spec.dispatch.backend = adapter();
    auto r = attention(x.q, x.k, x.v, spec);
    EXPECT_TRUE(r) << r.error().to_string();
    if (!r) return {};
    return std::move(r).value();
  }
};

// At the test's thread count and at one thread, where a contiguous cache's
// grouped-query decode takes keel's fused kernel (kernels/fused_decode.h).
TEST_P(DecodeConformance, MatchesFloat64Reference) {
  const DecodeCase& c = the_case();
  const Qkv x = make_qkv(c.shape, c.dtype);
  const int threads = at::get_num_threads();
  for (const int n : {threads, 1}) {
    if (n == 1 && threads == 1) break;
    at::set_num_threads(n);
    for (bool lse : {false, true}) {
      SCOPED_TRACE(std::to_string(n) + (lse ? " thread(s), with lse" : " thread(s), without lse"));
      AttentionSpec spec = c.spec(c.shape);
      spec.return_lse = lse;
      expect_within_rule(x, spec, run(x, spec), 1e-6);
    }
  }
  at::set_num_threads(threads);
}

// The decode path is differentiable: gradients of q, k and v against float64
// autograd, bounded by twice the same-precision naive error (plus a floor
// for entries whose naive error is 0).
TEST_P(DecodeConformance, GradientsMatchReferenceAutograd) {
  const DecodeCase& c = the_case();
  if (c.dtype != at::kFloat) GTEST_SKIP() << "gradients are checked in float32";
  // With the lse on the graph (keel's own products) and without it (where
  // the call allows, libtorch's flash kernel and its derivative).
  for (bool with_lse : {true, false}) {
    SCOPED_TRACE(with_lse ? "out and lse" : "out alone");
    Qkv x = make_qkv(c.shape, c.dtype);
    const std::vector<at::Tensor> inputs = {x.q.requires_grad_(true), x.k.requires_grad_(true),
                                            x.v.requires_grad_(true)};
    AttentionSpec spec = c.spec(c.shape);
    spec.return_lse = with_lse;
    expect_gradients_within_rule(x, spec, run(x, spec), inputs, kGradientFloor);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAdapter, DecodeConformance,
                         ::testing::Combine(::testing::ValuesIn(testing::adapters_in_build()),
                                            ::testing::ValuesIn(names_of(decode_cases()))),
                         adapter_and_case_name);

}  // namespace
}  // namespace keel
