// record and compare on this build: what passes, what fails, and how bad
// golden files are reported.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/diff.h"
#include "engine/safetensors.h"
#include "suite/record_compare.h"

namespace keel::harness {
namespace {

class UpgradeCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "keel-golden-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".safetensors";
    RecordOptions o;
    o.out = path_;
    o.filter = "float64/rows,float32/masked,bfloat16/large";
    ASSERT_EQ(record(o).value(), 3u);
  }
  void TearDown() override { std::remove(path_.c_str()); }

  result<Report> compare_file(const std::string& path, int repeat = 2) {
    CompareOptions o;
    o.golden = path;
    o.repeat = repeat;
    return compare(o);
  }
  // Rewrites the golden file through `edit`.
  template <class F>
  void edit(F&& f) {
    TensorFile file = read_safetensors(path_).value();
    f(file);
    ASSERT_TRUE(write_safetensors(path_, file));
  }
  std::string path_;
};

TEST_F(UpgradeCheck, SameBuildPassesDeterministically) {
  result<Report> r = compare_file(path_, 3);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r.value().passed, 3);
  EXPECT_EQ(r.value().failed + r.value().errors + r.value().skipped, 0);
  for (const CaseReport& c : r.value().cases) {
    EXPECT_TRUE(c.deterministic) << c.id;
    EXPECT_EQ(c.outputs.size(), 2u) << c.id;  // value and grad_input
    EXPECT_GT(c.forward_ms, 0) << c.id;
  }
  EXPECT_EQ(r.value().golden.at("keel_format"), "1");
  const nlohmann::json j = to_json(r.value());
  EXPECT_EQ(j["summary"]["passed"], 3);
  EXPECT_NE(to_html(r.value()).find("<svg"), std::string::npos);
  EXPECT_NE(summary_text(r.value()).find("3 passed, 0 failed"), std::string::npos);
}

TEST_F(UpgradeCheck, AMovedOutputFailsWithItsError) {
  edit([](TensorFile& f) {
    at::Tensor& v = f.tensors.at("logsumexp/float64/rows/out/value");
    v = v.clone();
    v[0] += 1e-6;  // far beyond float64's 1e-10
  });
  result<Report> r = compare_file(path_);
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value().failed, 1);
  for (const CaseReport& c : r.value().cases) {
    if (c.id != "logsumexp/float64/rows") continue;
    EXPECT_EQ(c.status, "fail");
    EXPECT_NEAR(c.max_abs, 1e-6, 1e-9);
  }
}

TEST_F(UpgradeCheck, UnknownFamilyIsSkippedWithTheReason) {
  edit([](TensorFile& f) {
    nlohmann::json cases = nlohmann::json::parse(f.metadata.at("cases"));
    cases[0]["operation"] = "teleport";
    f.metadata["cases"] = cases.dump();
  });
  result<Report> r = compare_file(path_);
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value().skipped, 1);
  EXPECT_NE(r.value().cases[0].reason.find("teleport"), std::string::npos);
}

TEST_F(UpgradeCheck, NewerFormatIsAClearError) {
  edit([](TensorFile& f) { f.metadata["keel_format"] = "9"; });
  result<Report> r = compare_file(path_);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Errc::unsupported);
  EXPECT_NE(r.error().message().find("format 9"), std::string::npos) << r.error().message();
}

TEST_F(UpgradeCheck, ForeignOrBrokenFilesAreCorruptData) {
  edit([](TensorFile& f) { f.metadata.erase("keel_format"); });
  result<Report> foreign = compare_file(path_);
  ASSERT_FALSE(foreign);
  EXPECT_EQ(foreign.error().code(), Errc::corrupt_data);

  edit([](TensorFile& f) {
    f.metadata["keel_format"] = "1";
    f.metadata["cases"] = "{not json";
  });
  EXPECT_EQ(compare_file(path_).error().code(), Errc::corrupt_data);

  std::ofstream(path_, std::ios::trunc) << "truncated";
  result<Report> truncated = compare_file(path_);
  ASSERT_FALSE(truncated);
  EXPECT_EQ(truncated.error().code(), Errc::corrupt_data);
}

TEST_F(UpgradeCheck, InputsThatDoNotFitTheirCaseAreAnErrorNotACrash) {
  edit([](TensorFile& f) {
    f.tensors["logsumexp/float64/rows/in/upstream"] = at::zeros({3, 3, 3}, at::kDouble);
    f.tensors.erase("logsumexp/float32/masked/in/input");
  });
  result<Report> r = compare_file(path_);
  ASSERT_TRUE(r);
  EXPECT_EQ(r.value().errors, 2);
}

TEST_F(UpgradeCheck, BadOptionsAreReported) {
  EXPECT_EQ(compare_file(path_, 0).error().code(), Errc::invalid_argument);
  RecordOptions o;
  o.out = path_;
  o.filter = "no-such-case";
  EXPECT_EQ(record(o).error().code(), Errc::invalid_argument);
  o.filter = "float64/rows";
  o.out = "/nonexistent-dir/golden.safetensors";
  EXPECT_EQ(record(o).error().code(), Errc::io_error);
  EXPECT_EQ(compare_file("/nonexistent-dir/golden.safetensors").error().code(), Errc::io_error);
}

}  // namespace
}  // namespace keel::harness

namespace keel::harness {
namespace {

// keel-compat diff and compare share check_values: integer and boolean
// tensors are compared exactly even under a loose tolerance (--atol/--rtol
// or a policy file), in int64, so 2^53 + 1 is not taken for 2^53.
TEST(CheckValues, IntegersAreExactUnderAnyTolerance) {
  const Tolerance loose{100, 0.5};
  const at::Tensor a = at::tensor(std::vector<std::int64_t>{std::int64_t{1} << 53, 7, 1000});
  at::Tensor b = a.clone();
  b[0] += 1;
  b[2] -= 1;
  const ValueCheck v = check_values(a, b, loose, /*worst=*/5);
  EXPECT_TRUE(v.exact);
  EXPECT_FALSE(v.pass);
  EXPECT_EQ(v.mismatched, 2);
  ASSERT_EQ(v.worst.size(), 2u);
  EXPECT_EQ(v.worst[0].index, std::vector<std::int64_t>{0});
  EXPECT_EQ(v.worst[0].a_int, std::int64_t{1} << 53);
  EXPECT_EQ(v.worst[0].b_int, (std::int64_t{1} << 53) + 1);
  EXPECT_EQ(v.worst[1].index, std::vector<std::int64_t>{2});
  EXPECT_TRUE(check_values(a, a.clone(), loose).pass);
}

TEST(CheckValues, BooleansAreExactUnderAnyTolerance) {
  const at::Tensor a = at::tensor(std::vector<std::int64_t>{1, 0, 1}).to(at::kBool);
  const at::Tensor b = at::ones({3}, at::kBool);
  const ValueCheck v = check_values(a, b, Tolerance{1, 1});
  EXPECT_TRUE(v.exact);
  EXPECT_FALSE(v.pass);
  EXPECT_EQ(v.mismatched, 1);
}

TEST(CheckValues, FloatsKeepTheirTolerance) {
  const at::Tensor a = at::full({1}, 1000.0, at::kDouble);
  const ValueCheck v = check_values(a, a + 1, Tolerance{0, 1e-2});
  EXPECT_FALSE(v.exact);
  EXPECT_TRUE(v.pass);
}

}  // namespace
}  // namespace keel::harness
