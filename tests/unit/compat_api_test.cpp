// keel::compat, the public record/compare API: a service's own function
// recorded and replayed, its errors measured against float64 differences
// computed here with plain ATen ops, and bad files and bad cases reported
// as keel::Error.
#include "keel/v1/compat.h"

#include <cstdio>
#include <fstream>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace keel::compat {
namespace {

// The service's "model": y = tanh(x @ w) in the inputs' dtype, plus the
// row sums in float64.
result<Tensors> model(const Case& c) {
  const at::Tensor y = at::tanh(at::matmul(c.inputs.at("x"), c.inputs.at("w")));
  return Tensors{{"y", y}, {"rows", y.to(at::kDouble).sum(-1)}};
}

Case make_case(const std::string& id, at::ScalarType dtype, std::uint64_t seed) {
  at::manual_seed(seed);
  Case c;
  c.id = id;
  c.inputs["x"] = at::randn({8, 16}, at::kDouble).to(dtype);
  c.inputs["w"] = at::randn({16, 4}, at::kDouble).to(dtype);
  c.metadata["layer"] = "ffn";
  return c;
}

class CompatApi : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "keel-compat-api-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".safetensors";
    cases_ = {make_case("ffn/float64", at::kDouble, 1), make_case("ffn/float32", at::kFloat, 2),
              make_case("ffn/bfloat16", at::kBFloat16, 3)};
  }
  void TearDown() override { std::remove(path_.c_str()); }
  void record_model(const RecordOptions& options = {}) {
    result<void> r = record(path_, cases_, model, options);
    ASSERT_TRUE(r) << r.error().to_string();
  }
  const CaseResult& find(const Report& r, const std::string& id) {
    for (const CaseResult& c : r.cases) {
      if (c.id == id) return c;
    }
    ADD_FAILURE() << "no case " << id;
    return r.cases.front();
  }
  std::string path_;
  std::vector<Case> cases_;
};

TEST_F(CompatApi, TheSameFunctionPassesDeterministicallyWithItsMetadata) {
  RecordOptions o;
  o.metadata["model"] = "tiny-ffn";
  record_model(o);
  CompareOptions c;
  c.repeat = 3;
  result<Report> r = compare(path_, model, c);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_TRUE(r.value().ok());
  EXPECT_EQ(r.value().passed, 3);
  EXPECT_EQ(r.value().repeat, 3);
  EXPECT_EQ(r.value().golden.at("model"), "tiny-ffn");
  EXPECT_EQ(r.value().golden.at("keel_format"), "1");
  for (const CaseResult& k : r.value().cases) {
    EXPECT_EQ(k.status, CaseStatus::pass) << k.id << ": " << k.reason;
    EXPECT_TRUE(k.deterministic) << k.id;
    EXPECT_EQ(k.max_abs, 0) << k.id;
    EXPECT_EQ(k.outputs.size(), 2u) << k.id;
    EXPECT_EQ(k.metadata.at("layer"), "ffn") << k.id;
    EXPECT_GT(k.golden_ms, 0) << k.id;
    EXPECT_GT(k.ms, 0) << k.id;
    EXPECT_GT(k.peak_bytes, 0) << k.id;
  }
}

TEST_F(CompatApi, ToleranceFollowsTheLeastPreciseOutputOrTheCase) {
  cases_[1].tolerance = Tolerance{0.5, 0};
  cases_[2].output_tolerances["rows"] = Tolerance{0.25, 0};
  record_model();
  result<Report> r = compare(path_, model);
  ASSERT_TRUE(r) << r.error().to_string();
  // y is float64 (with float64 rows): float64's policy.
  EXPECT_EQ(find(r.value(), "ffn/float64").tolerance.atol, 1e-10);
  // The case's own.
  EXPECT_EQ(find(r.value(), "ffn/float32").tolerance.atol, 0.5);
  // y is bfloat16, rows float64: bfloat16's policy.
  EXPECT_EQ(find(r.value(), "ffn/bfloat16").tolerance.rtol, 1.6e-2);
  // An output's own tolerance overrides the case's, for that output only.
  for (const OutputResult& o : find(r.value(), "ffn/bfloat16").outputs) {
    EXPECT_EQ(o.tolerance.atol, o.name == "rows" ? 0.25 : 1e-2) << o.name;
  }
}

// A change of the function's numbers, as an upgrade might bring: the
// report's errors equal the difference computed here, and each case is
// judged by its tolerance.
TEST_F(CompatApi, AMovedOutputIsMeasuredAndJudgedByItsTolerance) {
  record_model();
  const double shift = 1e-7;
  auto moved = [&](const Case& c) -> result<Tensors> {
    result<Tensors> out = model(c);
    out.value()["rows"] = out.value()["rows"] + shift;
    return out;
  };
  result<Report> r = compare(path_, moved);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_FALSE(r.value().ok());
  for (const Case& c : cases_) {
    const at::Tensor want = model(c).value().at("rows");
    const at::Tensor got = moved(c).value().at("rows");
    const auto max_abs = (got - want).abs().max().item<double>();
    const CaseResult& k = find(r.value(), c.id);
    EXPECT_NEAR(k.max_abs, max_abs, 1e-15) << c.id;
    const bool within =
        ((got - want).abs() <= k.tolerance.atol + k.tolerance.rtol * want.abs()).all().item<bool>();
    EXPECT_EQ(k.status, within ? CaseStatus::pass : CaseStatus::fail) << c.id;
  }
  EXPECT_EQ(find(r.value(), "ffn/float64").status, CaseStatus::fail);
  EXPECT_EQ(find(r.value(), "ffn/bfloat16").status, CaseStatus::pass);
}

// Integer outputs match exactly, whatever the case's float policy: a token
// id off by one beside bfloat16 logits (whose policy would pass 1000 +- 16),
// and an int64 near 2^40 off by one under rtol 1e-10 (which would pass +-110).
// The reason names the output, the index and both values.
TEST_F(CompatApi, AnIntegerOutputOffByOneFailsWhateverTheFloatPolicy) {
  cases_[0].tolerance = Tolerance{1e-10, 1e-10};
  const std::int64_t big = (std::int64_t{1} << 40) + 12345;
  auto with_ids = [&](std::int64_t bump) {
    return [=](const Case& c) -> result<Tensors> {
      result<Tensors> out = model(c);
      at::Tensor token = at::arange(998, 1002, at::kLong);
      at::Tensor offset = at::full({3}, big, at::kLong);
      token[2] += bump;
      offset[1] += bump;
      out.value()["token"] = token;
      out.value()["offset"] = offset;
      return out;
    };
  };
  result<void> rec = record(path_, cases_, with_ids(0));
  ASSERT_TRUE(rec) << rec.error().to_string();
  result<Report> same = compare(path_, with_ids(0));
  ASSERT_TRUE(same) << same.error().to_string();
  EXPECT_TRUE(same.value().ok());
  result<Report> r = compare(path_, with_ids(1));
  ASSERT_TRUE(r) << r.error().to_string();
  for (const Case& c : cases_) {
    const CaseResult& k = find(r.value(), c.id);
    EXPECT_EQ(k.status, CaseStatus::fail) << c.id;
    for (const OutputResult& o : k.outputs) {
      EXPECT_EQ(o.pass, o.name != "token" && o.name != "offset") << c.id << " " << o.name;
    }
  }
  const std::string& reason = find(r.value(), "ffn/bfloat16").reason;
  EXPECT_NE(reason.find("output 'offset' int64 at [1]: " + std::to_string(big + 1) + ", recorded " +
                        std::to_string(big)),
            std::string::npos)
      << reason;
}

// An output whose dtype changed fails with both dtypes named, even when its
// values are equal.
TEST_F(CompatApi, AnOutputWhoseDtypeChangedFails) {
  record_model();
  auto widened = [&](const Case& c) -> result<Tensors> {
    result<Tensors> out = model(c);
    out.value()["rows"] = out.value()["rows"].to(at::kFloat).to(at::kDouble).to(at::kFloat);
    return out;
  };
  result<Report> r = compare(path_, widened);
  ASSERT_TRUE(r) << r.error().to_string();
  const CaseResult& k = find(r.value(), "ffn/float32");
  EXPECT_EQ(k.status, CaseStatus::fail);
  EXPECT_NE(k.reason.find("output 'rows': dtype float32, recorded float64"), std::string::npos)
      << k.reason;
}

TEST_F(CompatApi, ANondeterministicFunctionFails) {
  record_model();
  int calls = 0;
  auto flaky = [&](const Case& c) -> result<Tensors> {
    result<Tensors> out = model(c);
    if (++calls % 2 == 0) out.value()["y"] = out.value()["y"].clone().mul_(1 + 1e-12);
    return out;
  };
  CompareOptions o;
  o.filter = "float64";
  result<Report> r = compare(path_, flaky, o);
  ASSERT_TRUE(r);
  ASSERT_EQ(r.value().cases.size(), 1u);
  EXPECT_FALSE(r.value().cases[0].deterministic);
  EXPECT_EQ(r.value().cases[0].status, CaseStatus::fail);
}

TEST_F(CompatApi, FunctionErrorsThrowsUnsupportedAndMissingOutputs) {
  record_model();
  auto odd = [&](const Case& c) -> result<Tensors> {
    if (c.id == "ffn/float64") return Error(Errc::unsupported, "not on this build");
    if (c.id == "ffn/float32") throw std::runtime_error("boom");
    result<Tensors> out = model(c);
    out.value().erase("rows");
    return out;
  };
  result<Report> r = compare(path_, odd);
  ASSERT_TRUE(r);
  EXPECT_EQ(find(r.value(), "ffn/float64").status, CaseStatus::skipped);
  EXPECT_EQ(find(r.value(), "ffn/float32").status, CaseStatus::error);
  EXPECT_NE(find(r.value(), "ffn/float32").reason.find("boom"), std::string::npos);
  EXPECT_EQ(find(r.value(), "ffn/bfloat16").status, CaseStatus::fail);
  EXPECT_EQ(r.value().skipped + r.value().errors + r.value().failed, 3);
}

TEST_F(CompatApi, BadCasesAreInvalidArgument) {
  for (const char* id : {"", "a/in/b", "out", "x/out"}) {
    std::vector<Case> one = {make_case(id, at::kFloat, 4)};
    result<void> r = record(path_, one, model);
    ASSERT_FALSE(r) << "id '" << id << "'";
    EXPECT_EQ(r.error().code(), Errc::invalid_argument) << id;
  }
  std::vector<Case> twice = {make_case("same", at::kFloat, 5), make_case("same", at::kFloat, 6)};
  EXPECT_EQ(record(path_, twice, model).error().code(), Errc::invalid_argument);
  RecordOptions reserved;
  reserved.metadata["torch_version"] = "mine";
  EXPECT_EQ(record(path_, cases_, model, reserved).error().code(), Errc::invalid_argument);
  std::vector<Case> undefined = {make_case("u", at::kFloat, 7)};
  undefined[0].inputs["nothing"] = at::Tensor();
  EXPECT_EQ(record(path_, undefined, model).error().code(), Errc::invalid_argument);
  EXPECT_EQ(record(path_, cases_, Function()).error().code(), Errc::invalid_argument);
  auto undefined_output = [](const Case&) -> result<Tensors> {
    return Tensors{{"y", at::Tensor()}};
  };
  EXPECT_EQ(record(path_, cases_, undefined_output).error().code(), Errc::invalid_argument);
  std::vector<Case> unknown_output = {make_case("k", at::kFloat, 8)};
  unknown_output[0].output_tolerances["logits"] = Tolerance{1, 1};
  EXPECT_EQ(record(path_, unknown_output, model).error().code(), Errc::invalid_argument);
  auto failing = [](const Case&) -> result<Tensors> {
    return Error(Errc::backend_error, "the model failed");
  };
  result<void> failed = record(path_, cases_, failing);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code(), Errc::backend_error);
  EXPECT_NE(failed.error().message().find("ffn/float64"), std::string::npos);
}

TEST_F(CompatApi, BadFilesAreErrorsNeverCrashes) {
  EXPECT_EQ(compare(path_ + ".none", model).error().code(), Errc::io_error);
  std::ofstream(path_, std::ios::trunc) << "not a safetensors file at all";
  EXPECT_EQ(compare(path_, model).error().code(), Errc::corrupt_data);
  record_model();
  CompareOptions zero;
  zero.repeat = 0;
  EXPECT_EQ(compare(path_, model, zero).error().code(), Errc::invalid_argument);
}

TEST_F(CompatApi, ReportWritersCarryTheNumbers) {
  record_model();
  result<Report> r = compare(path_, model);
  ASSERT_TRUE(r);
  const nlohmann::json j = nlohmann::json::parse(to_json(r.value()));
  EXPECT_EQ(j["summary"]["passed"], 3);
  EXPECT_EQ(j["cases"].size(), 3u);
  EXPECT_EQ(j["cases"][0]["id"], r.value().cases[0].id);
  const std::string html = to_html(r.value());
  EXPECT_EQ(html.rfind("<!doctype html>", 0), 0u);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);  // no network assets
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_NE(to_text(r.value()).find("ffn/bfloat16"), std::string::npos);
}

}  // namespace
}  // namespace keel::compat
