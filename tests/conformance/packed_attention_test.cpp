// keel::attention over packed ragged queries (PackedQueries), against a paged
// cache and against packed keys: each sequence's rows against the float64
// reference on its own keys, against keel's own call of that sequence alone
// (bitwise where the plan is the same: a sequence whose query count no
// other sequence of the step has runs as that call), gradients of the varlen layout against float64
// autograd, and every bad offset an invalid_argument naming its field.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include "conformance/attention_support.h"
#include "keel/keel.h"
#include "reference/attention_reference.h"

namespace keel {
namespace {

using namespace attention_suite;  // NOLINT(google-build-using-namespace): the suite's own helpers

struct PackedCase {
  const char* name;
  std::int64_t Hq, Hkv, E, Ev;
  at::ScalarType dtype;
  std::int64_t page_size;
  std::vector<std::int64_t> q_lens, k_lens;  // per sequence
  std::function<AttentionSpec()> spec;
};

AttentionSpec causal_br() {
  return with_masks({Mask::causal(CausalAlignment::bottom_right)});
}

const std::vector<PackedCase>& packed_cases() {
  static const std::vector<PackedCase> cases = {
      // A serving step: decodes, a speculative verify (k+1 = 5), a prefill
      // chunk, a sequence of 0 queries, one of 0 keys.
      {"gqa32_8_e128_mixed_step",
       32,
       8,
       128,
       128,
       at::kFloat,
       16,
       {1, 5, 0, 64, 1, 1},
       {300, 129, 40, 512, 16, 0},
       causal_br},
      // One page exactly, one query past a page boundary.
      {"gqa32_1_e80_page_edges", 32, 1, 80, 80, at::kFloat, 16, {1, 2, 3}, {16, 17, 33}, causal_br},
      {"gqa32_8_e128_bf16",
       32,
       8,
       128,
       128,
       at::kBFloat16,
       16,
       {1, 4, 32},
       {200, 64, 300},
       causal_br},
      {"gqa8_2_window_softcap_alibi",
       8,
       2,
       64,
       48,
       at::kFloat,
       32,
       {3, 1, 7},
       {100, 50, 7},
       [] {
         AttentionSpec s = with_masks({Mask::sliding_window(20, 0, CausalAlignment::bottom_right)});
         s.softcap = 8;
         s.alibi_slopes = at::linspace(0.05, 0.4, 8, at::kFloat);
         return s;
       }},
      {"gqa4_2_key_padding_f64",
       4,
       2,
       32,
       32,
       at::kDouble,
       8,
       {2, 3},
       {20, 9},
       [] {
         return with_masks({Mask::causal(CausalAlignment::bottom_right),
                            Mask::key_padding(at::tensor({15, 9}, at::kLong))});
       }},
      // Every sequence with the same query count: the batched plan.
      {"gqa32_8_uniform_speculative",
       32,
       8,
       128,
       128,
       at::kFloat,
       16,
       {5, 5, 5, 5},
       {64, 100, 33, 250},
       causal_br},
  };
  return cases;
}

struct Packed {
  at::Tensor q;                      // [T, Hq, E]
  at::Tensor cu_q, cu_k;             // [B + 1]
  std::vector<at::Tensor> k, v;      // per sequence [1, Hkv, Lk_b, E]
  at::Tensor k_packed, v_packed;     // [S, Hkv, E]
  PagedKVCache cache;                // shuffled pages
  std::vector<std::int64_t> cq, ck;  // offsets
};

Packed make_packed(const PackedCase& c) {
  Packed p;
  const auto B = static_cast<std::int64_t>(c.q_lens.size());
  p.cq.push_back(0);
  p.ck.push_back(0);
  std::int64_t pages = 0, max_pages = 1;
  for (std::int64_t b = 0; b < B; ++b) {
    p.cq.push_back(p.cq.back() + c.q_lens[b]);
    p.ck.push_back(p.ck.back() + c.k_lens[b]);
    const std::int64_t n = (c.k_lens[b] + c.page_size - 1) / c.page_size;
    pages += n;
    max_pages = std::max(max_pages, n);
  }
  p.q = at::randn({p.cq.back(), c.Hq, c.E}, at::kDouble).to(c.dtype);
  p.cu_q = at::tensor(p.cq, at::kLong).to(at::kInt);
  p.cu_k = at::tensor(p.ck, at::kLong).to(at::kInt);
  const std::int64_t pool = pages + 2;
  const at::Tensor order = at::randperm(pool, at::kLong);
  p.cache.k_pages = at::randn({pool, c.Hkv, c.page_size, c.E}, at::kDouble).to(c.dtype);
  p.cache.v_pages = at::randn({pool, c.Hkv, c.page_size, c.Ev}, at::kDouble).to(c.dtype);
  p.cache.page_table = at::full({B, max_pages}, -1, at::kInt);
  p.cache.lengths = at::tensor(c.k_lens, at::kLong).to(at::kInt);
  std::int64_t slot = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t n = (c.k_lens[b] + c.page_size - 1) / c.page_size;
    at::Tensor kb = at::randn({1, c.Hkv, n * c.page_size, c.E}, at::kDouble).to(c.dtype);
    at::Tensor vb = at::randn({1, c.Hkv, n * c.page_size, c.Ev}, at::kDouble).to(c.dtype);
    for (std::int64_t i = 0; i < n; ++i, ++slot) {
      const auto id = order[slot].item<std::int64_t>();
      p.cache.page_table[b][i] = id;
      p.cache.k_pages[id].copy_(kb[0].narrow(1, i * c.page_size, c.page_size));
      p.cache.v_pages[id].copy_(vb[0].narrow(1, i * c.page_size, c.page_size));
    }
    p.k.push_back(kb.narrow(2, 0, c.k_lens[b]));
    p.v.push_back(vb.narrow(2, 0, c.k_lens[b]));
  }
  std::vector<at::Tensor> ks, vs;
  for (std::int64_t b = 0; b < B; ++b) {
    ks.push_back(p.k[b][0].transpose(0, 1));
    vs.push_back(p.v[b][0].transpose(0, 1));
  }
  p.k_packed = at::cat(ks, 0).contiguous();
  p.v_packed = at::cat(vs, 0).contiguous();
  return p;
}

// Sequence b's spec for the reference and the single call.
AttentionSpec one_spec(const AttentionSpec& spec, std::int64_t b) {
  AttentionSpec s = spec;
  for (Mask& m : s.masks) {
    if (m.kv_lengths.defined()) m.kv_lengths = m.kv_lengths.narrow(0, b, 1);
  }
  return s;
}

// Rows [cq[b], cq[b+1]) of a packed result as [1, Hq, Lq_b, ...].
at::Tensor rows(const at::Tensor& t, const Packed& p, std::int64_t b) {
  return t.narrow(0, p.cq[b], p.cq[b + 1] - p.cq[b]).transpose(0, 1).unsqueeze(0);
}

class PackedConformance : public ::testing::TestWithParam<PackedCase> {
 protected:
  void SetUp() override { at::manual_seed(2026); }
};

TEST_P(PackedConformance, PagedMatchesFloat64ReferenceAndTheSingleCalls) {
  const PackedCase& c = GetParam();
  const Packed p = make_packed(c);
  AttentionSpec spec = c.spec();
  spec.return_lse = true;
  c10::NoGradGuard no_grad;
  result<AttentionOutput> got = attention(PackedQueries{p.q, p.cu_q}, p.cache, spec);
  ASSERT_TRUE(got) << got.error().to_string();
  ASSERT_EQ(got.value().out.sizes(), at::IntArrayRef({p.cq.back(), c.Hq, c.Ev}));
  ASSERT_EQ(got.value().lse.sizes(), at::IntArrayRef({p.cq.back(), c.Hq}));
  for (std::size_t b = 0; b < c.q_lens.size(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    if (c.q_lens[b] == 0) continue;
    const AttentionOutput one{rows(got.value().out, p, b), rows(got.value().lse, p, b), {}};
    if (c.k_lens[b] == 0) {
      EXPECT_EQ(one.out.abs().max().item<double>(), 0.0);
      EXPECT_TRUE(one.lse.isneginf().all().item<bool>());
      continue;
    }
    const AttentionSpec s = one_spec(spec, static_cast<std::int64_t>(b));
    const Qkv x{rows(p.q, p, b), p.k[b], p.v[b]};
    expect_within_rule(x, s, one, 1e-6);
    // The same sequence alone on its cache row: bitwise where the step runs
    // it as that very call (no other sequence has its query count).
    PagedKVCache row = p.cache;
    row.page_table = p.cache.page_table.narrow(0, b, 1);
    row.lengths = p.cache.lengths.narrow(0, b, 1);
    result<AttentionOutput> alone = attention(x.q, row, s);
    ASSERT_TRUE(alone) << alone.error().to_string();
    if (std::count(c.q_lens.begin(), c.q_lens.end(), c.q_lens[b]) == 1) {
      EXPECT_TRUE(at::equal(alone.value().out, one.out));
      EXPECT_TRUE(at::equal(alone.value().lse, one.lse));
    }
  }
}

TEST_P(PackedConformance, VarlenForwardAndGradientsMatchFloat64Reference) {
  const PackedCase& c = GetParam();
  const Packed p = make_packed(c);
  AttentionSpec spec = c.spec();
  const at::Tensor q = p.q.clone().requires_grad_();
  const at::Tensor k = p.k_packed.clone().requires_grad_();
  const at::Tensor v = p.v_packed.clone().requires_grad_();
  result<AttentionOutput> got = attention(PackedQueries{q, p.cu_q}, PackedKeys{k, v, p.cu_k}, spec);
  ASSERT_TRUE(got) << got.error().to_string();
  ASSERT_EQ(got.value().out.sizes(), at::IntArrayRef({p.cq.back(), c.Hq, c.Ev}));
  const at::Tensor up = at::randn(got.value().out.sizes(), at::kDouble);
  (got.value().out.to(at::kDouble) * up).sum().backward();
  for (std::size_t b = 0; b < c.q_lens.size(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const std::int64_t lq = c.q_lens[b], lk = c.k_lens[b];
    if (lq == 0 || lk == 0) continue;
    const AttentionSpec s = one_spec(spec, static_cast<std::int64_t>(b));
    const at::Tensor up_b = rows(up, p, b);
    // The float64 reference and the same-precision naive one, with their
    // gradients under the same loss (FlashAttention's rule: keel within
    // twice the naive error, plus a floor).
    const auto grads = [&](at::ScalarType dtype) {
      const at::Tensor qb = rows(p.q, p, b).detach().to(dtype).requires_grad_();
      const at::Tensor kb = p.k[b].detach().to(dtype).requires_grad_();
      const at::Tensor vb = p.v[b].detach().to(dtype).requires_grad_();
      const at::Tensor out = reference::attention(qb, kb, vb, s, dtype).first;
      (out.to(at::kDouble) * up_b).sum().backward();
      return std::vector<at::Tensor>{out.detach(), qb.grad(), kb.grad(), vb.grad()};
    };
    const std::vector<at::Tensor> ref = grads(at::kDouble);
    const std::vector<at::Tensor> naive = grads(c.dtype);
    const std::vector<at::Tensor> mine = {
        rows(got.value().out, p, b), rows(q.grad(), p, b),
        k.grad().narrow(0, p.ck[b], lk).transpose(0, 1).unsqueeze(0),
        v.grad().narrow(0, p.ck[b], lk).transpose(0, 1).unsqueeze(0)};
    const double floor = c.dtype == at::kDouble ? 1e-12 : 1e-6;
    // The gradients' analysis term (attention_support.h): a kernel sums
    // dk and dv over the group's rows in one accumulator.
    const GradientAnalysisBounds sums =
        gradient_analysis_bounds(Qkv{rows(p.q, p, b), p.k[b], p.v[b]}, s, up_b, at::Tensor());
    const double sum_bound[] = {0, sums.q, sums.k, sums.v};
    const char* names[] = {"out", "grad q", "grad k", "grad v"};
    for (std::size_t n = 0; n < 4; ++n) {
      const double err = max_error(mine[n], ref[n]);
      const double naive_err = max_error(naive[n], ref[n]);
      EXPECT_LE(err, 2 * naive_err + floor + sum_bound[n])
          << names[n] << ": error " << err << ", naive " << naive_err << ", analysis term "
          << sum_bound[n];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PackedConformance, ::testing::ValuesIn(packed_cases()),
                         [](const ::testing::TestParamInfo<PackedCase>& info) {
                           return std::string(info.param.name);
                         });

struct BadOffsets {
  const char* name;
  std::vector<std::int64_t> cu;
  const char* says;
};

class PackedBadOffsets : public ::testing::TestWithParam<BadOffsets> {};

// Two sequences over 6 query rows: each bad offset list is invalid_argument
// naming the field, on the paged and the varlen call, before any row is read.
TEST_P(PackedBadOffsets, AreInvalidArgumentNamingTheField) {
  const BadOffsets& c = GetParam();
  const at::Tensor q = at::randn({6, 4, 16});
  PagedKVCache cache;
  cache.k_pages = at::randn({4, 2, 8, 16});
  cache.v_pages = at::randn({4, 2, 8, 16});
  cache.page_table = at::tensor({0, 1, 2, 3}, at::kInt).view({2, 2});
  cache.lengths = at::tensor({10, 16}, at::kInt);
  const at::Tensor cu = at::tensor(c.cu, at::kLong);
  c10::NoGradGuard no_grad;
  result<AttentionOutput> paged = attention(PackedQueries{q, cu}, cache);
  ASSERT_FALSE(paged);
  EXPECT_EQ(paged.error().code(), Errc::invalid_argument);
  EXPECT_NE(paged.error().message().find(c.says), std::string::npos) << paged.error().message();
  const at::Tensor k = at::randn({12, 2, 16});
  result<AttentionOutput> varlen = attention(
      PackedQueries{q, cu}, PackedKeys{k, k, at::tensor({0, 5, 12}, at::kLong)}, AttentionSpec{});
  ASSERT_FALSE(varlen);
  EXPECT_EQ(varlen.error().code(), Errc::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PackedBadOffsets,
    ::testing::Values(BadOffsets{"not_starting_at_0", {1, 3, 6}, "cu_seqlens_q[0] is 1"},
                      BadOffsets{"decreasing", {0, 4, 3}, "cu_seqlens_q[2] is 3, less than"},
                      BadOffsets{"past_t", {0, 3, 9}, "cu_seqlens_q[2] is 9; expected 6"},
                      BadOffsets{"short_of_t", {0, 3, 5}, "cu_seqlens_q[2] is 5; expected 6"},
                      BadOffsets{"batch_mismatch", {0, 2, 4, 6}, "4 offsets for 2 sequences"}),
    [](const ::testing::TestParamInfo<BadOffsets>& info) { return std::string(info.param.name); });

TEST(PackedAttention, TermsWithoutAPackedFormAreInvalidArgument) {
  const at::Tensor q = at::randn({3, 2, 8});
  PagedKVCache cache;
  cache.k_pages = at::randn({2, 1, 4, 8});
  cache.v_pages = at::randn({2, 1, 4, 8});
  cache.page_table = at::tensor({0, 1}, at::kInt).view({1, 2});
  cache.lengths = at::tensor({7}, at::kInt);
  AttentionSpec spec;
  spec.bias = at::zeros({1, 2, 3, 8});
  c10::NoGradGuard no_grad;
  result<AttentionOutput> r =
      attention(PackedQueries{q, at::tensor({0, 3}, at::kLong)}, cache, spec);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("spec.bias"), std::string::npos);
}

}  // namespace
}  // namespace keel
