// keel's Llama decoder (examples/models) running SmolLM2-135M-Instruct
// against the reference transformers wrote on the same weights
// (tests/models/make_reference.py, float32):
//   - the last position's logits within 1e-3 absolute (they are O(10));
//   - 32 greedy tokens identical, or the first divergence at a step where
//     the reference's top two logits are within 1e-4 (a near-tie);
//   - prefill through the packed call and token-by-token decode through the
//     paged cache giving the same logits, and the dense (training) forward
//     giving them too.
// One named case per prompt.
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include "llama.h"
#include "tensor_file.h"

namespace {

constexpr double kLogitTolerance = 1e-3;  // the bound: logits are O(10)
constexpr double kNearTie = 1e-4;
constexpr std::int64_t kPageSize = 16;

const std::map<std::string, at::Tensor>& reference() {
  static const std::map<std::string, at::Tensor> r = [] {
    auto file = models::read_tensor_file(KEEL_MODEL_REFERENCE_DIR "/smollm2-reference.safetensors");
    if (!file) ADD_FAILURE() << file.error().to_string();
    return file ? file.value() : std::map<std::string, at::Tensor>{};
  }();
  return r;
}

const models::Llama& model() {
  static const keel::result<models::Llama> m = models::Llama::load(KEEL_MODEL_DIR, at::kFloat);
  if (!m) ADD_FAILURE() << m.error().to_string();
  return m.value();
}

std::vector<std::int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

std::vector<std::int64_t> pages_for(std::int64_t tokens) {
  std::vector<std::int64_t> pages;
  for (std::int64_t p = 0; p * kPageSize < tokens; ++p) pages.push_back(p);
  return pages;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

class SmolLM2Conformance : public ::testing::TestWithParam<std::string> {
 protected:
  at::Tensor ref(const char* what) const {
    const auto it = reference().find(GetParam() + "/" + what);
    if (it == reference().end()) {
      ADD_FAILURE() << "no reference " << GetParam() << "/" << what;
      return {};
    }
    return it->second;
  }
};

TEST_P(SmolLM2Conformance, PrefillLogitsAndGreedyTokensEqualTransformers) {
  const std::vector<std::int64_t> prompt = to_vector(ref("prompt"));
  const std::vector<std::int64_t> expected = to_vector(ref("greedy"));
  const at::Tensor margins = ref("margins");
  const auto n = static_cast<std::int64_t>(prompt.size());
  const auto steps = static_cast<std::int64_t>(expected.size());
  models::KVCache cache = model().make_cache((n + steps) / kPageSize + 1, kPageSize);
  const std::vector<std::int64_t> pages = pages_for(n + steps);
  auto hidden = model().step({{prompt, 0, pages}}, cache);
  ASSERT_TRUE(hidden) << hidden.error().to_string();
  at::Tensor logits = model().logits(hidden.value().narrow(0, n - 1, 1))[0];
  const double err = max_abs_diff(logits, ref("logits"));
  EXPECT_LE(err, kLogitTolerance) << "last-position logits";
  RecordProperty("max_abs_logit_error", std::to_string(err));
  for (std::int64_t i = 0; i < steps; ++i) {
    const std::int64_t token = logits.argmax().item<std::int64_t>();
    if (token != expected[static_cast<std::size_t>(i)]) {
      // Allowed only where the reference itself nearly tied.
      EXPECT_LT(margins[i].item<double>(), kNearTie)
          << "greedy token " << i << ": keel " << token << ", transformers "
          << expected[static_cast<std::size_t>(i)] << " (reference margin "
          << margins[i].item<double>() << ")";
      return;
    }
    auto next = model().step({{{token}, n + i, pages}}, cache);
    ASSERT_TRUE(next) << next.error().to_string();
    logits = model().logits(next.value())[0];
  }
}

TEST_P(SmolLM2Conformance, DecodeThroughThePagedCacheEqualsPrefillAndTheDenseForward) {
  const std::vector<std::int64_t> prompt = to_vector(ref("prompt"));
  const auto n = static_cast<std::int64_t>(prompt.size());
  const std::vector<std::int64_t> pages = pages_for(n);
  // Prefill: every position's logits from one packed call.
  models::KVCache prefill_cache = model().make_cache(n / kPageSize + 1, kPageSize);
  auto prefill = model().step({{prompt, 0, pages}}, prefill_cache);
  ASSERT_TRUE(prefill) << prefill.error().to_string();
  const at::Tensor prefill_logits = model().logits(prefill.value());
  // Decode: one token at a time; the pages are listed in reverse order, so
  // the cache is read through the table, not by position.
  const std::vector<std::int64_t> table(pages.rbegin(), pages.rend());
  models::KVCache decode_cache = model().make_cache(n / kPageSize + 1, kPageSize);
  std::vector<at::Tensor> rows;
  for (std::int64_t i = 0; i < n; ++i) {
    auto h = model().step({{{prompt[static_cast<std::size_t>(i)]}, i, table}}, decode_cache);
    ASSERT_TRUE(h) << h.error().to_string();
    rows.push_back(model().logits(h.value()));
  }
  EXPECT_LE(max_abs_diff(at::cat(rows), prefill_logits), kLogitTolerance);
  // Training's dense forward over the whole prompt.
  c10::NoGradGuard no_grad;
  auto dense = model().forward(at::tensor(prompt).view({1, n}));
  ASSERT_TRUE(dense) << dense.error().to_string();
  EXPECT_LE(max_abs_diff(model().logits(dense.value()[0]), prefill_logits), kLogitTolerance);
}

// bfloat16 weights and activations against the float32 reference. bfloat16
// rounds to u = 2^-8 relative; each of the 30 blocks rounds its inputs,
// products and residual, so the logits' error grows as about sqrt(60)·u of
// their scale. The bound is 10·u·max|logit| (about 1.0 here); measured on
// this machine: 0.29 to 0.54 (RMS 0.06 to 0.25) over the four prompts.
TEST_P(SmolLM2Conformance, BFloat16LogitsWithinTheirRoundingBound) {
  static const keel::result<models::Llama> bf = models::Llama::load(KEEL_MODEL_DIR, at::kBFloat16);
  ASSERT_TRUE(bf) << bf.error().to_string();
  const std::vector<std::int64_t> prompt = to_vector(ref("prompt"));
  const auto n = static_cast<std::int64_t>(prompt.size());
  models::KVCache cache = bf.value().make_cache(n / kPageSize + 1, kPageSize);
  auto hidden = bf.value().step({{prompt, 0, pages_for(n)}}, cache);
  ASSERT_TRUE(hidden) << hidden.error().to_string();
  const at::Tensor logits = bf.value().logits(hidden.value().narrow(0, n - 1, 1))[0];
  const at::Tensor expected = ref("logits");
  const double bound = 10 * std::ldexp(1.0, -8) * expected.abs().max().item<double>();
  EXPECT_LE(max_abs_diff(logits, expected), bound);
  // The first greedy token agrees wherever the reference's margin exceeds
  // twice the bound.
  if (ref("margins")[0].item<double>() > 2 * bound) {
    EXPECT_EQ(logits.argmax().item<std::int64_t>(), ref("greedy")[0].item<std::int64_t>());
  }
}

std::vector<std::string> prompts() {
  std::vector<std::string> out;
  for (const auto& [name, t] : reference()) {
    const auto slash = name.find('/');
    if (name.substr(slash + 1) == "prompt") out.push_back(name.substr(0, slash));
  }
  if (out.empty()) out.push_back("reference_missing");
  return out;
}

INSTANTIATE_TEST_SUITE_P(Prompts, SmolLM2Conformance, ::testing::ValuesIn(prompts()),
                         [](const auto& info) { return info.param; });

TEST(SmolLM2BadInput, StepRefusesBadTokensPagesAndPositions) {
  models::KVCache cache = model().make_cache(2, kPageSize);
  const std::int64_t vocab = model().config().vocab_size;
  EXPECT_EQ(model().step({{{vocab}, 0, {0}}}, cache).error().code(), keel::Errc::invalid_argument);
  EXPECT_EQ(model().step({{{-1}, 0, {0}}}, cache).error().code(), keel::Errc::invalid_argument);
  EXPECT_EQ(model().step({{{1}, 0, {2}}}, cache).error().code(), keel::Errc::invalid_argument);
  EXPECT_EQ(model().step({{{1}, kPageSize, {0}}}, cache).error().code(),
            keel::Errc::invalid_argument);  // position 16 needs a second page
  EXPECT_EQ(model().step({{{1}, model().config().max_positions, {0, 1}}}, cache).error().code(),
            keel::Errc::invalid_argument);
  EXPECT_EQ(model().step({}, cache).error().code(), keel::Errc::invalid_argument);
}

TEST(SmolLM2BadInput, AMissingOrTruncatedWeightsFileIsAnErrorNamingIt) {
  const auto missing = models::Llama::load("/nonexistent");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("/nonexistent/config.json"), std::string::npos);
  // A copy of the model whose weights file ends early.
  const std::string dir = ::testing::TempDir() + "/truncated-model";
  ASSERT_EQ(std::system(("mkdir -p '" + dir + "' && cp " KEEL_MODEL_DIR "/config.json '" + dir +
                         "/' && head -c 100000000 " KEEL_MODEL_DIR "/model.safetensors > '" + dir +
                         "/model.safetensors'")
                            .c_str()),
            0);
  const auto truncated = models::Llama::load(dir);
  ASSERT_FALSE(truncated);
  EXPECT_EQ(truncated.error().code(), keel::Errc::corrupt_data);
  EXPECT_NE(truncated.error().message().find(dir + "/model.safetensors"), std::string::npos);
}

}  // namespace
