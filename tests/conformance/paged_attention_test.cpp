// keel::attention against a paged KV cache, on every adapter of this build:
// each sequence against the float64 reference on its own keys laid out
// contiguously, against keel's own contiguous call, and every bad table an
// invalid_argument.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include "conformance/adapters.h"
#include "conformance/attention_support.h"
#include "reference/attention_reference.h"

namespace keel {
namespace {

using namespace attention_suite;  // NOLINT(google-build-using-namespace): the suite's own helpers

// A paged call and the contiguous cache it was cut from: sequence b's key j
// is key j of k[b] (and of its page).
struct Paged {
  Shape shape;         // Lk: the table's keys, max_pages * page_size
  at::Tensor q, k, v;  // k, v [B, Hkv, max_pages * page_size, E or Ev]
  PagedKVCache cache;
};

// Cuts k and v into pages of `page_size`, placed in a shuffled pool with
// spare pages between them; table rows are padded with -1 (never read).
Paged make_paged(const Shape& s, at::ScalarType dtype, std::int64_t page_size,
                 const std::vector<std::int64_t>& lengths) {
  const std::int64_t max_pages = (s.Lk + page_size - 1) / page_size;
  Paged p;
  p.shape = s;
  p.shape.Lk = max_pages * page_size;
  const Qkv x = make_qkv(p.shape, dtype);
  p.q = x.q;
  p.k = x.k;
  p.v = x.v;
  std::int64_t used = 0;
  for (std::int64_t len : lengths) used += (len + page_size - 1) / page_size;
  const std::int64_t pool = used + 3;
  const at::Tensor order = at::randperm(pool, at::kLong);  // slot n -> page id order[n]
  p.cache.k_pages = at::randn({pool, s.Hkv, page_size, s.E}, at::kDouble).to(dtype);
  p.cache.v_pages = at::randn({pool, s.Hkv, page_size, s.Ev}, at::kDouble).to(dtype);
  p.cache.page_table = at::full({s.B, max_pages}, -1, at::kInt);
  p.cache.lengths = at::tensor(lengths, at::kLong).to(at::kInt);
  std::int64_t slot = 0;
  for (std::int64_t b = 0; b < s.B; ++b) {
    for (std::int64_t n = 0; n * page_size < lengths[b]; ++n, ++slot) {
      const auto id = order[slot].item<std::int64_t>();
      p.cache.page_table[b][n] = id;
      p.cache.k_pages[id].copy_(p.k[b].narrow(1, n * page_size, page_size));
      p.cache.v_pages[id].copy_(p.v[b].narrow(1, n * page_size, page_size));
    }
  }
  return p;
}

// The spec of sequence b alone on its first `len` keys, for the reference:
// per-sequence tensors narrowed to b, key-indexed ones to len.
AttentionSpec sequence_spec(const AttentionSpec& spec, std::int64_t b, std::int64_t batch,
                            std::int64_t len) {
  const auto row = [&](at::Tensor& t) {
    if (t.defined() && t.size(0) == batch && batch > 1) t = t.narrow(0, b, 1);
  };
  const auto keys = [&](at::Tensor& t) {
    if (t.defined() && t.size(-1) > 1) t = t.narrow(-1, 0, len);
  };
  AttentionSpec s = spec;
  for (Mask& m : s.masks) {
    row(m.prefix_lengths);
    row(m.kv_lengths);
    row(m.q_document_ids);
    row(m.kv_document_ids);
    keys(m.kv_document_ids);
    row(m.tensor);
    keys(m.tensor);
  }
  row(s.bias);
  keys(s.bias);
  return s;
}

struct PagedCase {
  const char* name;
  Shape shape;  // Lk: the longest sequence's keys
  at::ScalarType dtype;
  std::int64_t page_size;
  std::vector<std::int64_t> lengths;
  std::function<AttentionSpec(const Shape&)> spec;
};

const std::vector<PagedCase>& paged_cases() {
  static const std::vector<PagedCase> cases = {
      {"gqa32_8_lq1_causal_lengths_0_one_page_ragged",
       decode_shape(4, 32, 8, 1, 517, 128, 128),
       at::kFloat,
       16,
       {0, 16, 300, 517},
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
      {"gqa32_1_lq5_window_e80",
       decode_shape(3, 32, 1, 5, 700, 80, 80),
       at::kFloat,
       32,
       {5, 32, 700},
       [](const Shape&) {
         return with_masks({Mask::sliding_window(100, 0, CausalAlignment::bottom_right)});
       }},
      // keel's fused kernel: 12 rows per kv head, each its own window, head
      // dim 80, a sequence shorter than its queries and one of exactly a page.
      {"gqa16_4_lq3_fused_window_e80",
       decode_shape(3, 16, 4, 3, 700, 80, 80),
       at::kFloat,
       16,
       {3, 16, 700},
       [](const Shape&) {
         return with_masks({Mask::sliding_window(100, 0, CausalAlignment::bottom_right)});
       }},
      // 32 rows per kv head, the most the fused kernel takes on pages.
      {"gqa32_1_lq1_fused_32_rows",
       decode_shape(2, 32, 1, 1, 1000, 128, 128),
       at::kFloat,
       32,
       {1000, 31},
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
      {"gqa32_8_lq128_chunked_prefill",
       decode_shape(2, 32, 8, 128, 900, 64, 64),
       at::kFloat,
       64,
       {128, 900},
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
      {"gqa4_2_lq5_documents_ev_ne_e",
       decode_shape(2, 4, 2, 5, 640, 64, 48),
       at::kFloat,
       16,
       {640, 333},
       [](const Shape& s) {
         const at::Tensor kv =
             at::div(at::arange(s.Lk, at::kLong), 150, "floor").expand({s.B, s.Lk});
         const at::Tensor q = at::full({s.B, s.Lq}, 2, at::kLong);
         return with_masks(
             {Mask::document(q, kv.contiguous()), Mask::causal(CausalAlignment::bottom_right)});
       }},
      {"gqa32_8_lq1_softcap_alibi_bias",
       decode_shape(2, 32, 8, 1, 300, 128, 128),
       at::kFloat,
       16,
       {300, 77},
       [](const Shape& s) {
         AttentionSpec spec = with_masks({Mask::causal(CausalAlignment::bottom_right)});
         spec.softcap = 5.0;
         spec.alibi_slopes = at::linspace(0.01, 0.5, s.Hq, at::kFloat);
         spec.alibi_alignment = CausalAlignment::bottom_right;
         spec.bias = at::randn({s.B, 1, s.Lq, s.Lk});
         return spec;
       }},
      {"gqa8_8_lq16_bool_tensor_and_padding",
       decode_shape(2, 8, 8, 16, 400, 64, 64),
       at::kFloat,
       16,
       {400, 250},
       [](const Shape& s) {
         return with_masks({Mask::from_tensor(at::rand({s.B, 1, s.Lq, s.Lk}) > 0.3),
                            Mask::key_padding(at::tensor({390, 240}, at::kLong))});
       }},
      {"gqa32_8_lq1_bf16_window",
       decode_shape(2, 32, 8, 1, 3000, 128, 128),
       at::kBFloat16,
       16,
       {3000, 1},
       [](const Shape&) {
         return with_masks({Mask::sliding_window(512, 0, CausalAlignment::bottom_right)});
       }},
      {"gqa32_8_lq5_float16_causal",
       decode_shape(2, 32, 8, 5, 1000, 128, 128),
       at::kHalf,
       64,
       {1000, 64},
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
      {"gqa32_8_lq1_float64",
       decode_shape(2, 32, 8, 1, 300, 128, 128),
       at::kDouble,
       16,
       {300, 17},
       [](const Shape&) { return with_masks({Mask::causal(CausalAlignment::bottom_right)}); }},
  };
  return cases;
}

class PagedConformance : public AdapterAndCase {
 protected:
  const PagedCase& the_case() const { return case_named(paged_cases(), case_name()); }
  AttentionOutput run(const at::Tensor& q, const PagedKVCache& cache, AttentionSpec spec) const {
    spec.dispatch.backend = adapter();
    auto r = attention(q, cache, spec);
    EXPECT_TRUE(r) << r.error().to_string();
    if (!r) return {};
    return std::move(r).value();
  }
};

// Each sequence within the tolerance rule of the float64 reference on its
// own keys, out and lse; a sequence of length 0 gives 0 and -inf.
TEST_P(PagedConformance, EachSequenceMatchesFloat64ReferenceOnItsOwnKeys) {
  const PagedCase& c = the_case();
  const Paged p = make_paged(c.shape, c.dtype, c.page_size, c.lengths);
  AttentionSpec spec = c.spec(p.shape);
  spec.return_lse = true;
  const AttentionOutput got = run(p.q, p.cache, spec);
  ASSERT_TRUE(got.out.defined());
  ASSERT_EQ(got.out.sizes(), at::IntArrayRef({c.shape.B, c.shape.Hq, c.shape.Lq, c.shape.Ev}));
  for (std::int64_t b = 0; b < c.shape.B; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const std::int64_t len = c.lengths[b];
    if (len == 0) {  // every row fully masked (the reference takes no empty cache)
      EXPECT_EQ(got.out.narrow(0, b, 1).abs().max().item<double>(), 0.0);
      EXPECT_TRUE(got.lse.narrow(0, b, 1).isneginf().all().item<bool>());
      continue;
    }
    const Qkv x{p.q.narrow(0, b, 1), p.k.narrow(0, b, 1).narrow(2, 0, len),
                p.v.narrow(0, b, 1).narrow(2, 0, len)};
    AttentionOutput one{got.out.narrow(0, b, 1), got.lse.narrow(0, b, 1), got.dispatch};
    expect_within_rule(x, sequence_spec(spec, b, c.shape.B, len), one, 1e-6);
  }
}

// The paged call equals keel's contiguous call on each sequence's keys, to
// the documented tolerance: 32 ulp of the largest output (the contiguous
// call may run libtorch's flash kernel where the paged one runs keel's
// products over tiles of keys; both are held to float64 above).
TEST_P(PagedConformance, EqualsTheContiguousCallOnEachSequence) {
  const PagedCase& c = the_case();
  if (c.shape.Lq > 16) {
    GTEST_SKIP() << "Lq > 16: the contiguous call plans these queries as training (flash "
                    "kernel), not as decode; the float64 test holds this case";
  }
  const Paged p = make_paged(c.shape, c.dtype, c.page_size, c.lengths);
  AttentionSpec spec = c.spec(p.shape);
  spec.return_lse = true;
  const AttentionOutput paged = run(p.q, p.cache, spec);
  ASSERT_TRUE(paged.out.defined());
  for (std::int64_t b = 0; b < c.shape.B; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const std::int64_t len = c.lengths[b];
    auto r = attention(p.q.narrow(0, b, 1), p.k.narrow(0, b, 1).narrow(2, 0, len),
                       p.v.narrow(0, b, 1).narrow(2, 0, len), [&] {
                         AttentionSpec s = sequence_spec(spec, b, c.shape.B, len);
                         s.dispatch.backend = adapter();
                         return s;
                       }());
    ASSERT_TRUE(r) << r.error().to_string();
    const at::Tensor want = r.value().out.to(at::kDouble);
    const at::Tensor got = paged.out.narrow(0, b, 1).to(at::kDouble);
    const double eps = c.dtype == at::kDouble  ? 1e-15
                       : c.dtype == at::kFloat ? 1.2e-7
                                               : (c.dtype == at::kHalf ? 9.8e-4 : 7.8e-3);
    const double tolerance = 32 * eps * std::max(1.0, want.abs().max().item<double>());
    EXPECT_LE((got - want).abs().max().item<double>(), tolerance);
    EXPECT_TRUE(at::equal(paged.lse.narrow(0, b, 1).isneginf(), r.value().lse.isneginf()));
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAdapter, PagedConformance,
                         ::testing::Combine(::testing::ValuesIn(testing::adapters_in_build()),
                                            ::testing::ValuesIn(names_of(paged_cases()))),
                         adapter_and_case_name);

// A bad table, length or pool: invalid_argument naming the field, before any
// page is read; a padded table entry past a sequence's pages is never read.
struct PagedBadInput {
  const char* name;
  std::function<void(Paged&, AttentionSpec&)> spoil;
  const char* names;  // what the message must name ("" for a valid call)
  Errc code = Errc::invalid_argument;
};

const std::vector<PagedBadInput>& paged_bad_inputs() {
  static const std::vector<PagedBadInput> cases = {
      {"page_id_past_the_pool", [](Paged& p, AttentionSpec&) { p.cache.page_table[1][1] = 99; },
       "cache.page_table[1][1]"},
      {"negative_page_id", [](Paged& p, AttentionSpec&) { p.cache.page_table[0][0] = -1; },
       "cache.page_table[0][0]"},
      {"padding_entry_is_never_read",
       [](Paged& p, AttentionSpec&) { p.cache.page_table[0][3] = 1 << 30; }, ""},
      {"length_past_the_table", [](Paged& p, AttentionSpec&) { p.cache.lengths[0] = 4 * 16 + 1; },
       "cache.lengths[0]"},
      {"negative_length", [](Paged& p, AttentionSpec&) { p.cache.lengths[1] = -3; },
       "cache.lengths[1]"},
      {"float_table",
       [](Paged& p, AttentionSpec&) { p.cache.page_table = p.cache.page_table.to(at::kFloat); },
       "cache.page_table"},
      {"table_of_rank_1",
       [](Paged& p, AttentionSpec&) { p.cache.page_table = p.cache.page_table.flatten(); },
       "cache.page_table"},
      {"table_rows_not_batch",
       [](Paged& p, AttentionSpec&) { p.cache.page_table = p.cache.page_table.narrow(0, 0, 1); },
       "cache.page_table"},
      {"undefined_lengths", [](Paged& p, AttentionSpec&) { p.cache.lengths = at::Tensor(); },
       "cache.lengths"},
      {"lengths_not_batch",
       [](Paged& p, AttentionSpec&) {
         p.cache.lengths = at::tensor({3, 4, 5}, at::kInt);
       },
       "cache.lengths"},
      {"pools_of_different_page_size",
       [](Paged& p, AttentionSpec&) { p.cache.v_pages = p.cache.v_pages.narrow(2, 0, 8); },
       "cache.v_pages"},
      {"pool_of_another_dtype",
       [](Paged& p, AttentionSpec&) { p.cache.k_pages = p.cache.k_pages.to(at::kDouble); },
       "cache.k_pages"},
      {"pool_head_dim_not_query",
       [](Paged& p, AttentionSpec&) { p.cache.k_pages = p.cache.k_pages.narrow(3, 0, 16); },
       "head dim"},
      {"kv_heads_not_dividing",
       [](Paged& p, AttentionSpec&) {
         p.cache.k_pages = at::randn({p.cache.k_pages.size(0), 3, 16, 32});
         p.cache.v_pages = at::randn({p.cache.k_pages.size(0), 3, 16, 32});
       },
       "Hq % Hkv"},
      {"pool_of_page_size_0",
       [](Paged& p, AttentionSpec&) {
         p.cache.k_pages = p.cache.k_pages.narrow(2, 0, 0);
         p.cache.v_pages = p.cache.v_pages.narrow(2, 0, 0);
       },
       "page size 0"},
      {"block_mask",
       [](Paged&, AttentionSpec& s) {
         BlockMask bm;
         bm.kv_num_blocks = at::ones({1, 1, 1}, at::kInt);
         bm.kv_indices = at::zeros({1, 1, 1, 1}, at::kInt);
         s.masks = {Mask::block_mask(bm)};
       },
       "spec.masks[0]"},
      {"document_ids_shorter_than_the_table",
       [](Paged&, AttentionSpec& s) {
         s.masks = {Mask::document(at::zeros({2, 1}, at::kLong), at::zeros({2, 10}, at::kLong))};
       },
       "spec.masks[0]"},
      {"query_requires_grad",
       [](Paged& p, AttentionSpec&) { p.q = p.q.detach().requires_grad_(true); }, "NoGradGuard",
       Errc::unsupported},
  };
  return cases;
}

class PagedBadInputTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PagedBadInputTest, IsAnErrorNamingTheFieldNeverARead) {
  at::manual_seed(testing::kSeed);
  const PagedBadInput* c = &case_named(paged_bad_inputs(), GetParam());
  // 2 sequences of 40 and 20 keys, 4 table entries of 16 keys each.
  Paged p = make_paged(decode_shape(2, 4, 2, 1, 64, 32, 32), at::kFloat, 16, {40, 20});
  AttentionSpec spec;
  c->spoil(p, spec);
  auto r = attention(p.q, p.cache, spec);
  if (std::string(c->names).empty()) {
    EXPECT_TRUE(r) << r.error().to_string();
    return;
  }
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), c->code) << r.error().to_string();
  EXPECT_NE(r.error().message().find(c->names), std::string::npos) << r.error().message();
}

INSTANTIATE_TEST_SUITE_P(Paged, PagedBadInputTest,
                         ::testing::ValuesIn(names_of(paged_bad_inputs())),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace keel
