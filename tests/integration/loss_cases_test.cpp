// The vocabulary-parallel cases of keel-compat's loss family: each runs on
// its ranks (spawned keel-compat processes) and must give the unsharded
// loss and gradients, judged against the float64 reference on the case's
// stored inputs; shards that do not fit the stored weight are corrupt data.
#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "reference/linear_cross_entropy_reference.h"
#include "suite/rank_workers.h"
#include "suite/suite.h"

namespace keel::harness {
namespace {

// The family's cases whose ids contain "vocab_parallel", by name.
std::vector<Case> sharded_cases() {
  std::vector<Case> out;
  for (Case& c : find_family("linear_cross_entropy")->make_cases()) {
    if (c.id.find("/vocab_parallel_") != std::string::npos) out.push_back(std::move(c));
  }
  return out;
}

class VocabParallelCase : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { set_comm_launch({KEEL_COMPAT_EXE, std::chrono::seconds(120)}); }
};

TEST_P(VocabParallelCase, GivesTheUnshardedFloat64ResultOnItsStoredInputs) {
  const std::vector<Case> cases = sharded_cases();
  const auto it =
      std::find_if(cases.begin(), cases.end(), [&](const Case& c) { return c.id == GetParam(); });
  ASSERT_NE(it, cases.end()) << GetParam();
  const Case& c = *it;
  const result<harness::Run> run = find_family("linear_cross_entropy")->run(c, Backend::compat);
  ASSERT_TRUE(run) << run.error().to_string();
  EXPECT_EQ(run.value().adapter, "compat");

  const LinearCrossEntropyOptions o = harness::loss_options_of(c);
  reference::LinearCrossEntropyCase ref_case;
  ref_case.reduction = o.reduction;
  ref_case.label_smoothing = o.label_smoothing;
  ref_case.z_loss = o.z_loss;
  ref_case.logit_softcap = o.logit_softcap;
  ref_case.class_weights = o.class_weights;
  const at::Tensor h = c.inputs.at("hidden").to(at::kDouble).requires_grad_(true);
  const at::Tensor w = c.inputs.at("weight").to(at::kDouble).requires_grad_(true);
  std::vector<at::Tensor> wrt{h, w};
  if (c.inputs.count("bias") != 0u) {
    ref_case.bias = c.inputs.at("bias").to(at::kDouble).requires_grad_(true);
    wrt.push_back(ref_case.bias);
  }
  const at::Tensor loss =
      reference::linear_cross_entropy(h, w, c.inputs.at("target"), ref_case).loss;
  const at::Tensor upstream = c.inputs.count("upstream") != 0u
                                  ? c.inputs.at("upstream").to(at::kDouble)
                                  : at::ones_like(loss);
  const auto grads = torch::autograd::grad({loss}, wrt, {upstream});
  std::vector<std::pair<std::string, at::Tensor>> want{
      {"loss", loss.detach()}, {"grad_hidden", grads[0]}, {"grad_weight", grads[1]}};
  if (grads.size() > 2) want.emplace_back("grad_bias", grads[2]);

  // Within the case's dtype policy (what keel-compat judges a release by),
  // against float64 where the stored inputs are exact in both.
  const bool half = c.dtype == "bfloat16";
  const double atol = half ? 2e-2 : 1e-5;
  const double rtol = half ? 2e-2 : 1e-5;
  ASSERT_EQ(run.value().outputs.size(), want.size());
  for (const auto& [name, expected] : want) {
    ASSERT_EQ(run.value().outputs.count(name), 1u) << name;
    const at::Tensor got = run.value().outputs.at(name).to(at::kDouble);
    ASSERT_EQ(got.sizes(), expected.sizes()) << name;
    const double scale = expected.abs().max().item<double>();
    const double err = (got - expected).abs().max().item<double>();
    EXPECT_LE(err, atol + rtol * scale)
        << c.id << " " << name << " (largest |value| " << scale << ")";
  }
}

std::vector<std::string> sharded_ids() {
  std::vector<std::string> ids;
  for (const Case& c : sharded_cases()) ids.push_back(c.id);
  return ids;
}

INSTANTIATE_TEST_SUITE_P(LossFamily, VocabParallelCase, ::testing::ValuesIn(sharded_ids()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param.substr(info.param.find('/') + 1);
                           std::replace(name.begin(), name.end(), '/', '_');
                           return name;
                         });

TEST(LossFamily, ShardsThatDoNotFitTheStoredWeightAreCorruptData) {
  Case c = sharded_cases().front();
  const nlohmann::json bad_specs[] = {nlohmann::json::array(),   // no ranks
                                      {{0, 600}, {600, 401}},    // past the last class
                                      {{-1, 600}, {599, 401}},   // below class 0
                                      {{0, 0}, {0, 1000}},       // an empty shard
                                      {{0, "600"}, {600, 400}},  // not a number
                                      nlohmann::json::object({{"rank0", 600}})};  // not a list
  for (const nlohmann::json& spec : bad_specs) {
    c.options["shards"] = spec;
    const result<harness::Run> run = find_family("linear_cross_entropy")->run(c, Backend::compat);
    ASSERT_FALSE(run) << spec.dump();
    EXPECT_EQ(run.error().code(), Errc::corrupt_data) << spec.dump();
    EXPECT_NE(run.error().message().find("options.shards"), std::string::npos)
        << run.error().message();
  }
}

TEST(LossFamily, ShardsThatDoNotTileTheVocabularyAreKeelsInvalidArgumentOnTheRanks) {
  set_comm_launch({KEEL_COMPAT_EXE, std::chrono::seconds(120)});
  Case c = sharded_cases().front();
  c.options["shards"] = {{0, 500}, {600, 400}};  // classes 500..599 held by nobody
  const result<harness::Run> run = find_family("linear_cross_entropy")->run(c, Backend::compat);
  ASSERT_FALSE(run);
  EXPECT_EQ(run.error().code(), Errc::backend_error);
  EXPECT_NE(run.error().message().find("gap"), std::string::npos) << run.error().message();
}

}  // namespace
}  // namespace keel::harness
