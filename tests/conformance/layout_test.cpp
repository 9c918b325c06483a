// Every memory layout a user may pass, on every route: a property test. Each
// draw lays the inputs out at random (dims in another memory order, padding
// between rows, a storage offset, the last dimension at stride 2, a slice of
// a fused buffer, a broadcast dimension at stride 0, zero-size dimensions)
// and checks keel's output, and its gradients where the route trains,
// against the float64 reference on the same logical values, under the rules
// of the other suites. keel's policy (kernels/attention_route.h,
// keel/v1/attention.h) is to read every layout, copying only a tensor whose
// last dimension is strided, so no draw may be refused. The suite runs under
// ASan in CI: a read past a view fails loudly there.
//
// KEEL_LAYOUT_DRAWS=N sets the draws per route (default 150).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/StringUtil.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "conformance/adapters.h"
#include "conformance/attention_support.h"
#include "reference/attention_reference.h"
#include "reference/logsumexp_reference.h"

namespace keel {
namespace {

using namespace attention_suite;  // NOLINT(google-build-using-namespace): the suite's own helpers

using Rng = std::mt19937_64;

std::int64_t uniform(Rng& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}
bool chance(Rng& rng, double p) {
  return std::bernoulli_distribution(p)(rng);
}

int draws_per_route() {
  // NOLINTNEXTLINE(concurrency-mt-unsafe): read before the test starts threads
  const char* text = std::getenv("KEEL_LAYOUT_DRAWS");
  const int n = text == nullptr ? 0 : std::atoi(text);
  return n > 0 ? n : 150;
}

std::string describe(const char* name, const at::Tensor& t) {
  return c10::str(name, " sizes ", t.sizes(), " strides ", t.strides(), " offset ",
                  t.storage_offset());
}

// A tensor equal to `values` (up to a broadcast dimension, whose values then
// repeat its first slice) in a layout drawn from `rng`. `grad`: the result is
// a view of a leaf that requires grad, so gradients reach it.
at::Tensor lay_out(const at::Tensor& values, Rng& rng, bool grad, bool broadcast) {
  const std::int64_t n = values.dim();
  std::vector<std::int64_t> perm(static_cast<std::size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  if (chance(rng, 0.5)) std::shuffle(perm.begin(), perm.end(), rng);  // transposed views
  const bool interleave = chance(rng, 0.3);  // the innermost memory dim at stride 2
  std::vector<std::int64_t> alloc, start;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t size = values.size(perm[static_cast<std::size_t>(i)]);
    // Padding between rows; on the last dim, a fused QKV buffer's slice.
    const std::int64_t pad =
        chance(rng, 0.35) ? uniform(rng, 1, 2 * std::max<std::int64_t>(size, 1)) : 0;
    alloc.push_back(size + pad);
    start.push_back(pad > 0 ? uniform(rng, 0, pad) : 0);
  }
  if (interleave) alloc.push_back(2);
  std::vector<std::int64_t> inverse(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    inverse[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])] = i;
  // Storage before the view: a non-zero offset.
  const std::int64_t lead = chance(rng, 0.5) ? uniform(rng, 1, 7) : 0;
  std::int64_t total = lead;
  {
    std::int64_t elems = 1;
    for (std::int64_t a : alloc) elems *= a;
    total += elems;
  }
  // Everything around the view is poison: NaN, or an id no table holds, so
  // that a read past the view shows in the output.
  at::Tensor buf =
      values.is_floating_point()
          ? at::full({total}, std::numeric_limits<double>::quiet_NaN(), values.options())
          : at::full({total}, std::int64_t{1} << 40, values.options());
  const auto view = [&](const at::Tensor& b) {
    at::Tensor x = b.narrow(0, lead, total - lead).view(alloc);
    if (interleave) x = x.select(-1, 0);
    for (std::int64_t i = 0; i < n; ++i) {
      x = x.narrow(i, start[static_cast<std::size_t>(i)],
                   values.size(perm[static_cast<std::size_t>(i)]));
    }
    return x.permute(inverse);
  };
  {
    const at::NoGradGuard no_grad;
    view(buf).copy_(values);
  }
  if (grad) buf.requires_grad_();
  at::Tensor x = view(buf);
  if (broadcast && n > 1 && chance(rng, 0.25)) {
    const std::int64_t d = uniform(rng, 0, n - 1);
    if (x.size(d) > 1) x = x.narrow(d, 0, 1).expand(x.sizes());
  }
  return x;
}

at::Tensor randn(at::IntArrayRef sizes) {
  return at::randn(sizes, at::kDouble).to(at::kFloat);
}

// The float64 reference (or the float32 naive one) of a packed call: each
// sequence's rows [T, Hq, Ev] from its queries and keys, in the packed order.
at::Tensor packed_reference(const at::Tensor& q,
                            const std::function<at::Tensor(std::size_t, bool)>& keys,
                            const std::vector<std::int64_t>& cq,
                            const std::vector<std::int64_t>& lk, std::int64_t ev,
                            const AttentionSpec& spec, at::ScalarType dtype) {
  std::vector<at::Tensor> rows;
  for (std::size_t b = 0; b + 1 < cq.size(); ++b) {
    const std::int64_t lq = cq[b + 1] - cq[b];
    if (lq == 0) continue;
    const at::Tensor qb = q.narrow(0, cq[b], lq).transpose(0, 1).unsqueeze(0);
    if (lk[b] == 0) {
      rows.push_back(at::zeros({lq, q.size(1), ev}, q.options().dtype(dtype)) +
                     0 * qb.sum().to(dtype));
      continue;
    }
    const at::Tensor out =
        reference::attention(qb, keys(b, true), keys(b, false), spec, dtype).first;
    rows.push_back(out.squeeze(0).transpose(0, 1));
  }
  if (rows.empty()) return at::zeros({0, q.size(1), ev}, q.options().dtype(dtype));
  return at::cat(rows, 0);
}

// keel's error against float64 within twice the naive float32 error plus
// `floor` (the suites' rule), for a value and, where given, its gradients.
void expect_rule(const char* what, const at::Tensor& got, const at::Tensor& naive,
                 const at::Tensor& want, double floor) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  if (want.numel() == 0) return;
  EXPECT_FALSE(got.isnan().any().item<bool>()) << what;
  const double err = max_error(got, want);
  const double naive_err = max_error(naive, want);
  EXPECT_LE(err, 2 * naive_err + floor) << what << ": error " << err << ", naive " << naive_err;
}

// The gradients of sum(out * up) with respect to `inputs`, by the same rule,
// with `sums[i]` the analysis term of input i's gradient
// (attention_support.h), 0 where not given.
void expect_gradients(const at::Tensor& got, const at::Tensor& naive, const at::Tensor& want,
                      const std::vector<at::Tensor>& inputs, const char* const* names,
                      const at::Tensor& up, const std::vector<double>& sums = {}) {
  const auto grads = [&](const at::Tensor& out) {
    return torch::autograd::grad({(out.to(at::kDouble) * up).sum()}, inputs, {}, true, false, true);
  };
  const auto g = grads(got);
  const auto n = grads(naive);
  const auto w = grads(want);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!w[i].defined()) continue;
    expect_rule(names[i], g[i].defined() ? g[i] : at::zeros_like(w[i]),
                n[i].defined() ? n[i] : at::zeros_like(w[i]), w[i],
                kGradientFloor + (i < sums.size() ? sums[i] : 0.0));
  }
}

struct Route {
  const char* name;
  std::function<void(Rng&)> draw;
};

const char* const kQkvNames[] = {"grad q", "grad k", "grad v"};

// A dense call [B, H, L, E] of `route`'s shape, forward and backward.
void dense_draw(Rng& rng, AttentionRoute route) {
  static const std::int64_t heads[][2] = {{4, 2}, {2, 2}, {6, 3}, {8, 1}};
  const auto& h = heads[uniform(rng, 0, 3)];
  Shape s;
  s.B = chance(rng, 0.05) ? 0 : uniform(rng, 1, 2);
  s.Hq = h[0];
  s.Hkv = h[1];
  s.E = chance(rng, 0.5) ? 16 : 32;
  s.Ev = s.E;
  AttentionSpec spec;
  if (route == AttentionRoute::decode) {
    s.Lq = uniform(rng, 1, 16);
    s.Lk = uniform(rng, s.Lq, 40);
    if (chance(rng, 0.5)) spec.masks = {Mask::causal(CausalAlignment::bottom_right)};
  } else if (route == AttentionRoute::dense) {
    s.Lq = s.Lk = uniform(rng, 17, 48);
    if (chance(rng, 0.5)) spec.masks = {Mask::causal()};
  } else {
    s.Lq = s.Lk = uniform(rng, 17, 64);
    spec.masks = {Mask::sliding_window(uniform(rng, 1, 16), 0)};
  }
  const Qkv values = make_qkv(s);
  const Qkv x{lay_out(values.q, rng, true, true), lay_out(values.k, rng, true, true),
              lay_out(values.v, rng, true, true)};
  SCOPED_TRACE(describe("q", x.q) + "; " + describe("k", x.k) + "; " + describe("v", x.v));
  result<AttentionOutput> got = attention(x.q, x.k, x.v, spec);
  ASSERT_TRUE(got) << got.error().to_string();
  expect_within_rule(x, spec, got.value(), 1e-6);
  if (x.q.numel() > 0) {
    EXPECT_EQ(got.value().dispatch.attention.route, route);
    expect_gradients_within_rule(x, spec, got.value(), {x.q, x.k, x.v}, kGradientFloor);
  }
}

// Pools of pages in drawn layouts, shuffled; the keys of sequence b gathered
// back for the reference.
struct Pages {
  PagedKVCache cache;
  std::vector<std::int64_t> lengths;
  at::Tensor keys(std::size_t b, bool k) const {
    const at::Tensor& pool = k ? cache.k_pages : cache.v_pages;
    const std::int64_t page = pool.size(2);
    const std::int64_t n = (lengths[b] + page - 1) / page;
    const at::Tensor ids =
        cache.page_table[static_cast<std::int64_t>(b)].narrow(0, 0, n).to(at::kLong);
    return pool.index_select(0, ids)
        .permute({1, 0, 2, 3})
        .reshape({1, pool.size(1), n * page, pool.size(3)})
        .narrow(2, 0, lengths[b]);
  }
};

Pages draw_pages(Rng& rng, std::int64_t batch, std::int64_t kv_heads, std::int64_t e,
                 std::vector<std::int64_t> lengths) {
  const std::int64_t page = uniform(rng, 1, 8);
  const std::int64_t max_pages =
      (*std::max_element(lengths.begin(), lengths.end()) + page - 1) / page + 1;
  const std::int64_t pool = batch * max_pages + 2;
  Pages p;
  p.lengths = std::move(lengths);
  p.cache.k_pages = lay_out(randn({pool, kv_heads, page, e}), rng, false, false);
  p.cache.v_pages = lay_out(randn({pool, kv_heads, page, e}), rng, false, false);
  p.cache.page_table =
      at::randperm(pool, at::kLong).narrow(0, 0, batch * max_pages).view({batch, max_pages});
  p.cache.lengths = at::tensor(p.lengths, at::kLong);
  return p;
}

void paged_draw(Rng& rng) {
  const at::NoGradGuard no_grad;
  const std::int64_t batch = uniform(rng, 1, 3), hkv = uniform(rng, 1, 2),
                     hq = hkv * uniform(rng, 1, 4);
  const std::int64_t lq = uniform(rng, 1, 16), e = chance(rng, 0.5) ? 16 : 32;
  std::vector<std::int64_t> lengths;
  for (std::int64_t b = 0; b < batch; ++b) lengths.push_back(uniform(rng, lq, 40));
  const Pages p = draw_pages(rng, batch, hkv, e, lengths);
  const at::Tensor q = lay_out(randn({batch, hq, lq, e}), rng, false, true);
  AttentionSpec spec;
  if (chance(rng, 0.5)) spec.masks = {Mask::causal(CausalAlignment::bottom_right)};
  SCOPED_TRACE(describe("q", q) + "; " + describe("k_pages", p.cache.k_pages) + "; " +
               describe("v_pages", p.cache.v_pages));
  result<AttentionOutput> got = attention(q, p.cache, spec);
  ASSERT_TRUE(got) << got.error().to_string();
  EXPECT_EQ(got.value().dispatch.attention.route, AttentionRoute::paged);
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto i = static_cast<std::size_t>(b);
    const at::Tensor qb = q.narrow(0, b, 1);
    const at::Tensor want = reference::attention(qb, p.keys(i, true), p.keys(i, false), spec).first;
    const at::Tensor naive =
        reference::attention(qb, p.keys(i, true), p.keys(i, false), spec, at::kFloat).first;
    expect_rule("out", got.value().out.narrow(0, b, 1), naive, want, 1e-6);
  }
}

// Offsets of `count` sequences of lengths in [lo, hi], and the lengths.
std::vector<std::int64_t> offsets(Rng& rng, std::int64_t count, std::int64_t lo, std::int64_t hi,
                                  std::vector<std::int64_t>* lens) {
  std::vector<std::int64_t> cu{0};
  for (std::int64_t b = 0; b < count; ++b) {
    lens->push_back(uniform(rng, lo, hi));
    cu.push_back(cu.back() + lens->back());
  }
  return cu;
}

void packed_paged_draw(Rng& rng) {
  const at::NoGradGuard no_grad;
  const std::int64_t batch = uniform(rng, 1, 3), hkv = uniform(rng, 1, 2),
                     hq = hkv * uniform(rng, 1, 4);
  const std::int64_t e = chance(rng, 0.5) ? 16 : 32;
  std::vector<std::int64_t> lq;
  const std::vector<std::int64_t> cq = offsets(rng, batch, 0, 12, &lq);
  std::vector<std::int64_t> lengths;
  for (std::int64_t b = 0; b < batch; ++b)
    lengths.push_back(uniform(rng, lq[static_cast<std::size_t>(b)], 40));
  const Pages p = draw_pages(rng, batch, hkv, e, lengths);
  const at::Tensor q = lay_out(randn({cq.back(), hq, e}), rng, false, true);
  const AttentionSpec spec = with_masks({Mask::causal(CausalAlignment::bottom_right)});
  SCOPED_TRACE(describe("q", q) + "; " + describe("k_pages", p.cache.k_pages) + "; " +
               describe("v_pages", p.cache.v_pages));
  result<AttentionOutput> got =
      attention(PackedQueries{q, at::tensor(cq, at::kLong)}, p.cache, spec);
  ASSERT_TRUE(got) << got.error().to_string();
  const auto keys = [&](std::size_t b, bool k) { return p.keys(b, k); };
  const at::Tensor want = packed_reference(q, keys, cq, lengths, e, spec, at::kDouble);
  const at::Tensor naive = packed_reference(q, keys, cq, lengths, e, spec, at::kFloat);
  expect_rule("out", got.value().out, naive, want, 1e-6);
}

void varlen_draw(Rng& rng) {
  const std::int64_t batch = uniform(rng, 1, 3), hkv = uniform(rng, 1, 2),
                     hq = hkv * uniform(rng, 1, 4);
  const std::int64_t e = chance(rng, 0.5) ? 16 : 32;
  std::vector<std::int64_t> lq, lk;
  const std::vector<std::int64_t> cq = offsets(rng, batch, 0, 24, &lq);
  const std::vector<std::int64_t> ck = offsets(rng, batch, 1, 40, &lk);
  const at::Tensor q = lay_out(randn({cq.back(), hq, e}), rng, true, true);
  const at::Tensor k = lay_out(randn({ck.back(), hkv, e}), rng, true, true);
  const at::Tensor v = lay_out(randn({ck.back(), hkv, e}), rng, true, true);
  const AttentionSpec spec = chance(rng, 0.5)
                                 ? with_masks({Mask::causal(CausalAlignment::bottom_right)})
                                 : AttentionSpec{};
  SCOPED_TRACE(describe("q", q) + "; " + describe("k", k) + "; " + describe("v", v));
  result<AttentionOutput> got = attention(PackedQueries{q, at::tensor(cq, at::kLong)},
                                          PackedKeys{k, v, at::tensor(ck, at::kLong)}, spec);
  ASSERT_TRUE(got) << got.error().to_string();
  const auto keys = [&](std::size_t b, bool key) {
    return (key ? k : v).narrow(0, ck[b], lk[b]).transpose(0, 1).unsqueeze(0);
  };
  const at::Tensor want = packed_reference(q, keys, cq, lk, e, spec, at::kDouble);
  const at::Tensor naive = packed_reference(q, keys, cq, lk, e, spec, at::kFloat);
  expect_rule("out", got.value().out, naive, want, 1e-6);
  if (want.numel() == 0) return;
  const at::Tensor up = at::randn(want.sizes(), at::kDouble);
  std::vector<double> sums(3, 0.0);
  for (std::size_t b = 0; b + 1 < cq.size(); ++b) {
    if (lq[b] == 0) continue;
    const GradientAnalysisBounds one = gradient_analysis_bounds(
        Qkv{q.narrow(0, cq[b], lq[b]).transpose(0, 1).unsqueeze(0), keys(b, true), keys(b, false)},
        spec, up.narrow(0, cq[b], lq[b]).transpose(0, 1).unsqueeze(0), at::Tensor());
    sums = {std::max(sums[0], one.q), std::max(sums[1], one.k), std::max(sums[2], one.v)};
  }
  expect_gradients(got.value().out, naive, want, {q, k, v}, kQkvNames, up, sums);
}

// The fused loss (mean over the tokens not ignored) and its gradients.
void loss_draw(Rng& rng) {
  const std::int64_t n = uniform(rng, 1, 24), d = uniform(rng, 4, 48), vocab = uniform(rng, 2, 70);
  const at::Tensor hidden = lay_out(randn({n, d}), rng, true, true);
  const at::Tensor weight = lay_out(randn({vocab, d}), rng, true, true);
  at::Tensor target_values = at::randint(vocab, {n}, at::kLong);
  if (n > 1) {
    target_values[0] = -100;  // ignored; the others are not
    target_values[1] = 0;
  }
  const at::Tensor target = lay_out(target_values, rng, false, false);
  SCOPED_TRACE(describe("hidden", hidden) + "; " + describe("weight", weight) + "; " +
               describe("target", target));
  result<LossOutput> got = linear_cross_entropy(hidden, weight, target);
  ASSERT_TRUE(got) << got.error().to_string();
  const auto plain = [&](at::ScalarType dtype) {
    const at::Tensor logits = hidden.to(dtype).matmul(weight.to(dtype).t());
    const at::Tensor keep = target.ne(-100);
    const at::Tensor t = target.clamp_min(0).unsqueeze(1);
    const at::Tensor per = (logits.logsumexp(1) - logits.gather(1, t).squeeze(1)) * keep.to(dtype);
    return per.sum() / keep.sum().to(dtype);
  };
  const at::Tensor want = plain(at::kDouble);
  const at::Tensor naive = plain(at::kFloat);
  expect_rule("loss", got.value().loss, naive, want,
              4e-7 * std::max(1.0, want.abs().item<double>()));
  const char* const names[] = {"grad hidden", "grad weight"};
  if (n > 1) {
    expect_gradients(got.value().loss, naive, want, {hidden, weight}, names,
                     at::randn({}, at::kDouble));
  }
}

void logsumexp_draw(Rng& rng) {
  const std::int64_t rows = chance(rng, 0.05) ? 0 : uniform(rng, 1, 12), cols = uniform(rng, 1, 40);
  const at::Tensor input = lay_out(randn({rows, cols}), rng, true, true);
  LogsumexpOptions o;
  o.dim = chance(rng, 0.5) ? -1 : 0;
  o.keepdim = chance(rng, 0.5);
  SCOPED_TRACE(describe("input", input) + " dim " + std::to_string(o.dim));
  result<LogsumexpOutput> got = logsumexp(input, o);
  ASSERT_TRUE(got) << got.error().to_string();
  const at::Tensor want = input.to(at::kDouble).logsumexp(o.dim, o.keepdim);
  const at::Tensor naive = input.logsumexp(o.dim, o.keepdim);
  expect_rule("logsumexp", got.value().value, naive, want,
              4e-7 * std::max(1.0, want.numel() > 0 ? want.abs().max().item<double>() : 1.0));
  const char* const names[] = {"grad input"};
  if (want.numel() > 0) {
    expect_gradients(got.value().value, naive, want, {input}, names,
                     at::randn(want.sizes(), at::kDouble));
  }
}

std::vector<Route> routes() {
  return {
      {"decode", [](Rng& r) { dense_draw(r, AttentionRoute::decode); }},
      {"dense", [](Rng& r) { dense_draw(r, AttentionRoute::dense); }},
      {"block_sparse", [](Rng& r) { dense_draw(r, AttentionRoute::block_sparse); }},
      {"paged", paged_draw},
      {"packed_paged", packed_paged_draw},
      {"varlen", varlen_draw},
      {"loss", loss_draw},
      {"logsumexp", logsumexp_draw},
  };
}

class LayoutConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(LayoutConformance, EveryDrawnLayoutMatchesTheFloat64Reference) {
  const auto all = routes();
  const Route& route = case_named(all, GetParam());
  const auto index = static_cast<std::uint64_t>(&route - all.data());
  const int draws = draws_per_route();
  for (int i = 0; i < draws; ++i) {
    SCOPED_TRACE("draw " + std::to_string(i));
    // Each draw its own seed: a failure replays alone.
    Rng rng(testing::kSeed + (index << 20U) + static_cast<std::uint64_t>(i));
    at::manual_seed(testing::kSeed + static_cast<std::uint64_t>(i));
    route.draw(rng);
    if (::testing::Test::HasFailure()) break;  // the first failing draw, not a hundred
  }
}

INSTANTIATE_TEST_SUITE_P(Routes, LayoutConformance, ::testing::ValuesIn(names_of(routes())),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace keel
