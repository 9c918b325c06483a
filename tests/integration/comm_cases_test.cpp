// The comm family of keel-compat: recorded and replayed in spawned
// keel-compat processes on every adapter of this build, judged against
// values computed here from the stored inputs with plain ATen ops; a hung,
// failing or unsupported worker ends its case with the reason, never a hang.
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "conformance/adapters.h"
#include "engine/safetensors.h"
#include "suite/rank_workers.h"
#include "suite/record_compare.h"

namespace keel::harness {
namespace {

using Clock = std::chrono::steady_clock;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + name;
}

// An executable shell script standing in for keel-compat's comm-worker.
std::string fake_worker(const std::string& name, const std::string& body) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::trunc) << "#!/bin/sh\n" << body << "\n";
  ::chmod(path.c_str(), 0755);
  return path;
}

class CommCases : public ::testing::TestWithParam<Backend> {
 protected:
  static void SetUpTestSuite() {
    set_comm_launch({KEEL_COMPAT_EXE, std::chrono::seconds(60)});
    RecordOptions o;
    o.out = golden();
    o.filter = "comm/";
    const result<std::size_t> n = record(o);
    ASSERT_TRUE(n) << n.error().to_string();
    ASSERT_EQ(n.value(), 14u);
  }
  static void TearDownTestSuite() { std::remove(golden().c_str()); }
  void TearDown() override { set_comm_launch({KEEL_COMPAT_EXE, std::chrono::seconds(60)}); }

  static std::string golden() { return temp_path("keel-comm-golden.safetensors"); }

  static result<Report> compare_golden(const std::string& filter, Backend backend, int repeat = 2) {
    CompareOptions o;
    o.golden = golden();
    o.filter = filter;
    o.backend = backend;
    o.repeat = repeat;
    return compare(o);
  }
};

TEST_P(CommCases, ReplayPassesExactlyAndDeterministically) {
  const result<Report> r = compare_golden("comm/", GetParam(), 2);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_EQ(r.value().passed, 14) << summary_text(r.value());
  for (const CaseReport& c : r.value().cases) {
    EXPECT_EQ(c.status, "pass") << c.id << ": " << c.reason;
    EXPECT_TRUE(c.deterministic) << c.id;
    EXPECT_EQ(c.adapter, to_string(GetParam())) << c.id;
    EXPECT_EQ(c.tolerance.atol, 0) << c.id;  // judged exactly
    EXPECT_EQ(c.max_abs, 0) << c.id;
    EXPECT_GT(c.forward_ms, 0) << c.id;
    ASSERT_EQ(c.outputs.size(), 2u) << c.id;
    EXPECT_EQ(c.outputs[0].name, "rank0");
    EXPECT_EQ(c.outputs[1].name, "rank1");
  }
}

INSTANTIATE_TEST_SUITE_P(EveryAdapter, CommCases, ::testing::ValuesIn(testing::adapters_in_build()),
                         testing::adapter_name);

// The recorded outputs, from the stored inputs alone.
TEST(CommFamily, RecordedOutputsEqualPlainAtenOnTheStoredInputs) {
  set_comm_launch({KEEL_COMPAT_EXE, std::chrono::seconds(60)});
  const std::string path = temp_path("keel-comm-aten.safetensors");
  RecordOptions o;
  o.out = path;
  o.filter = "comm/";
  ASSERT_TRUE(record(o));
  const TensorFile file = read_safetensors(path).value();
  std::remove(path.c_str());
  const nlohmann::json cases = nlohmann::json::parse(file.metadata.at("cases"));
  const std::size_t family_size = find_family("comm")->make_cases().size();
  ASSERT_EQ(cases.size(), family_size);
  ASSERT_GT(family_size, 0u);
  int checked = 0;
  for (const nlohmann::json& c : cases) {
    const std::string id = c["id"];
    const nlohmann::json& opt = c["options"];
    const at::Tensor a = file.tensors.at(id + "/in/rank0");
    const at::Tensor b = file.tensors.at(id + "/in/rank1");
    ASSERT_FALSE(at::equal(a, b)) << id << ": the ranks' inputs must differ";
    at::Tensor want0, want1;
    const std::string op = opt["op"];
    if (op == "all_reduce") {
      const std::string reduce = opt["reduce"];
      if (reduce == "sum") want0 = a + b;
      if (reduce == "avg") want0 = (a + b) / 2;
      if (reduce == "max") want0 = at::maximum(a, b);
      want1 = want0;
    } else if (op == "all_gather") {
      want0 = want1 = at::cat({a, b});
    } else if (op == "reduce_scatter") {
      const auto halves = (a + b).chunk(2);
      want0 = halves[0];
      want1 = halves[1];
    } else if (op == "broadcast") {
      ASSERT_EQ(opt["root"], 1);
      want0 = want1 = b;
    }
    ASSERT_TRUE(want0.defined()) << id;
    const at::Tensor got0 = file.tensors.at(id + "/out/rank0");
    const at::Tensor got1 = file.tensors.at(id + "/out/rank1");
    EXPECT_EQ(got0.scalar_type(), a.scalar_type()) << id;
    EXPECT_EQ(got0.sizes(), want0.sizes()) << id;
    EXPECT_TRUE(at::equal(got0, want0)) << id << ": rank 0";
    EXPECT_TRUE(at::equal(got1, want1)) << id << ": rank 1";
    ++checked;
  }
  EXPECT_EQ(static_cast<std::size_t>(checked), family_size);
  for (const char* id :
       {"comm/float32/all_reduce_sum", "comm/bfloat16/all_reduce_avg", "comm/int64/all_reduce_sum",
        "comm/float32/all_reduce_max", "comm/bfloat16/all_gather", "comm/int64/reduce_scatter_sum",
        "comm/bfloat16/broadcast_root1"}) {
    EXPECT_EQ(file.tensors.count(std::string(id) + "/in/rank0"), 1u) << id;
  }
}

TEST(CommFamily, CasesAreListedAndFiltered) {
  const Family* family = find_family("comm");
  ASSERT_NE(family, nullptr);
  const std::vector<Case> cases = family->make_cases();
  ASSERT_FALSE(cases.empty());
  // The filter for one dtype selects exactly that dtype's cases.
  std::map<std::string, std::size_t> per_dtype;
  for (const Case& c : cases) {
    EXPECT_EQ(c.operation, "comm");
    EXPECT_EQ(c.inputs.size(), 2u) << c.id;
    const std::string rest = c.id.substr(c.id.find('/') + 1);
    ++per_dtype[rest.substr(0, rest.find('/'))];
  }
  ASSERT_GE(per_dtype.size(), 2u);
  for (const auto& [dtype, count] : per_dtype) {
    std::size_t selected = 0;
    for (const Case& c : cases) selected += matches_filter(c.id, "comm/" + dtype);
    EXPECT_EQ(selected, count) << dtype;
  }
}

TEST(CommFamily, AHungWorkerIsKilledAndTheCaseErrs) {
  set_comm_launch({fake_worker("keel-hung-worker.sh", "echo waiting forever; exec sleep 600"),
                   std::chrono::milliseconds(1500)});
  const Case c = find_family("comm")->make_cases().front();
  const auto start = Clock::now();
  const result<harness::Run> run = find_family("comm")->run(c, Backend::compat);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  set_comm_launch({KEEL_COMPAT_EXE, std::chrono::seconds(60)});
  ASSERT_FALSE(run);
  EXPECT_EQ(run.error().code(), Errc::timeout);
  EXPECT_NE(run.error().message().find("did not finish within 1500 ms and was killed"),
            std::string::npos)
      << run.error().message();
  EXPECT_NE(run.error().message().find("waiting forever"), std::string::npos);
  EXPECT_LT(seconds, 10);
}

TEST(CommFamily, AWorkerThatCannotServeTheCaseSkipsItWithTheReason) {
  const std::string golden = temp_path("keel-comm-skip.safetensors");
  set_comm_launch({KEEL_COMPAT_EXE, std::chrono::seconds(60)});
  RecordOptions o;
  o.out = golden;
  o.filter = "comm/float32/broadcast";
  ASSERT_TRUE(record(o));
  set_comm_launch({fake_worker("keel-unsupported-worker.sh",
                               "echo 'unsupported: comm: this build has no gloo' >&2; exit 3"),
                   std::chrono::seconds(20)});
  CompareOptions co;
  co.golden = golden;
  const result<Report> r = compare(co);
  set_comm_launch(
      {fake_worker("keel-failing-worker.sh", "echo 'backend_error: the wire broke' >&2; exit 1"),
       std::chrono::seconds(20)});
  const result<Report> failing = compare(co);
  set_comm_launch({KEEL_COMPAT_EXE, std::chrono::seconds(60)});
  std::remove(golden.c_str());
  ASSERT_TRUE(r);
  ASSERT_EQ(r.value().cases.size(), 1u);
  EXPECT_EQ(r.value().skipped, 1);
  EXPECT_NE(r.value().cases[0].reason.find("this build has no gloo"), std::string::npos)
      << r.value().cases[0].reason;
  ASSERT_TRUE(failing);
  EXPECT_EQ(failing.value().errors, 1);
  EXPECT_NE(failing.value().cases[0].reason.find("the wire broke"), std::string::npos)
      << failing.value().cases[0].reason;
}

TEST(CommFamily, NativeOnABuildWithoutItIsSkipped) {
#if KEEL_TEST_EXPECT_NATIVE
  GTEST_SKIP() << "this build has the native adapter";
#else
  set_comm_launch({KEEL_COMPAT_EXE, std::chrono::seconds(60)});
  const Case c = find_family("comm")->make_cases().front();
  const result<harness::Run> run = find_family("comm")->run(c, Backend::native);
  ASSERT_FALSE(run);
  EXPECT_EQ(run.error().code(), Errc::unsupported) << run.error().to_string();
  EXPECT_NE(run.error().message().find("native"), std::string::npos);
#endif
}

TEST(CommFamily, StoredInputsThatDoNotFitAreAnError) {
  set_comm_launch({KEEL_COMPAT_EXE, std::chrono::seconds(60)});
  Case c = find_family("comm")->make_cases().front();  // all_reduce_sum, [13]
  c.inputs.erase("rank1");
  const result<harness::Run> missing = find_family("comm")->run(c, Backend::compat);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), Errc::corrupt_data);
  EXPECT_NE(missing.error().message().find("rank1"), std::string::npos);

  // Shapes that differ between the ranks never reach the workers.
  c = find_family("comm")->make_cases().front();
  c.inputs["rank1"] = at::zeros({4}, at::kFloat);
  const result<harness::Run> mismatch = find_family("comm")->run(c, Backend::compat);
  ASSERT_FALSE(mismatch);
  EXPECT_EQ(mismatch.error().code(), Errc::corrupt_data);
  EXPECT_NE(mismatch.error().message().find("shape [4]"), std::string::npos)
      << mismatch.error().message();
}

TEST(CommFamily, WorkerUsageErrorsExitTwo) {
  EXPECT_EQ(comm_worker_main({}), 2);
  EXPECT_EQ(comm_worker_main({"--rank"}), 2);
  EXPECT_EQ(comm_worker_main({"--rank", "7", "--case", "x"}), 2);
  EXPECT_EQ(comm_worker_main({"--teleport", "1"}), 2);
  EXPECT_EQ(comm_worker_main({"--case", "x", "--rank", "0", "--port", "1", "--inputs",
                              "/nonexistent.safetensors", "--out", "/tmp/x"}),
            1);
}

}  // namespace
}  // namespace keel::harness
