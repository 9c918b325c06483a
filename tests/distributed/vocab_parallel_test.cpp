// The vocabulary-parallel loss across processes: 2 and 3
// keel_vocab_parallel_worker ranks on loopback, each holding a shard of the
// output embedding, checked against the unsharded float64 reference (the
// workers check values; this file checks exits, the cross-rank agreement of
// the loss's bits, and the errors of bad calls and dead ranks).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "world.h"

namespace {

using keel::testing::expect_all_passed;
using keel::testing::Millis;

struct World : keel::testing::World {
  World(const std::string& scenario, int world, std::vector<std::string> extra = {})
      : keel::testing::World(KEEL_VOCAB_PARALLEL_WORKER, scenario, world, std::move(extra)) {}
};

// The cases of tests/distributed/vocab_parallel_worker.cpp (kCases).
const char* const kCaseNames[] = {
    "mean_plain",        "mean_smooth_weights", "mean_everything",     "mean_ignore_is_a_class",
    "mean_all_ignored",  "sum_z_bias",          "sum_weights_softcap", "none_everything",
    "vocab_blocks_mean", "vocab_blocks_none",   "float32_everything",  "no_grad",
};

// The text after `word ` on the line where it first appears in `log`.
std::string line_after(const std::string& log, const std::string& word) {
  const auto at = log.find(word + " ");
  if (at == std::string::npos) return {};
  const auto end = log.find('\n', at);
  return log.substr(at + word.size() + 1, end - at - word.size() - 1);
}

class VocabParallelLoss : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(VocabParallelLoss, MatchesTheUnshardedFloat64ReferenceOnEveryRank) {
  const auto [name, ranks] = GetParam();
  World w("case", ranks, {"--case", name});
  ASSERT_TRUE(w.wait(Millis(180000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, name);
  // Every rank computed bitwise the same loss and per-token loss.
  const std::string rank0 = line_after(w.log(0), "LOSS");
  ASSERT_FALSE(rank0.empty()) << w.all_logs();
  for (int r = 1; r < ranks; ++r) {
    EXPECT_EQ(line_after(w.log(r), "LOSS"), rank0) << "rank " << r << "\n" << w.all_logs();
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, VocabParallelLoss,
                         ::testing::Combine(::testing::ValuesIn(kCaseNames),
                                            ::testing::Values(2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<const char*, int>>& info) {
                           return std::string(std::get<0>(info.param)) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "_ranks";
                         });

class VocabParallelFaults : public ::testing::TestWithParam<int> {};

TEST_P(VocabParallelFaults, OneRanksBadArgumentsGiveEveryRankAnError) {
  World w("bad_input", GetParam());
  ASSERT_TRUE(w.wait(Millis(60000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "bad_input");
}

TEST_P(VocabParallelFaults, RanksThatDisagreeAreNamed) {
  World w("disagree", GetParam());
  ASSERT_TRUE(w.wait(Millis(60000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "disagree");
}

TEST_P(VocabParallelFaults, ShardsWithAGapOrAnOverlapAreRefused) {
  World w("gap", GetParam());
  ASSERT_TRUE(w.wait(Millis(60000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "gap");
}

TEST_P(VocabParallelFaults, RankKilledMidLossGivesPeerLost) {
  const int ranks = GetParam();
  World w("die_in_forward", ranks);
  ASSERT_TRUE(w.wait(Millis(120000))) << "hang\n" << w.all_logs();
  for (int r = 0; r + 1 < ranks; ++r) {
    EXPECT_EQ(w.status(r), 0) << "survivor " << r << "\n" << w.all_logs();
  }
  EXPECT_EQ(w.status(ranks - 1), 128 + 9) << w.all_logs();  // SIGKILL
  std::printf("rank killed mid-loss (%d ranks): %s\n", ranks,
              line_after(w.log(0), "losses before the failure").c_str());
}

TEST_P(VocabParallelFaults, RankLostBeforeARecomputingBackwardMakesBackwardThrow) {
  World w("die_before_backward", GetParam());
  ASSERT_TRUE(w.wait(Millis(120000))) << "hang\n" << w.all_logs();
  expect_all_passed(w, "die_before_backward");
}

INSTANTIATE_TEST_SUITE_P(Ranks, VocabParallelFaults, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "_ranks";
                         });

}  // namespace
