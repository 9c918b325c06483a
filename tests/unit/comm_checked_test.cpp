// Checked mode's descriptors (src/comm/checked.h): what each rank posts,
// its store form, and the sentence every rank writes when they disagree.
#include "comm/checked.h"

#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace keel::comm::detail {
namespace {

using Descriptors = std::vector<std::optional<Descriptor>>;

TEST(CommChecked, PlainDescriptorNamesDtypeShapeAndDetail) {
  const Descriptor d = describe_tensor_call(at::zeros({4, 8}, at::kFloat), "(sum)");
  EXPECT_EQ(d.call, "float32 [4, 8](sum)");
  EXPECT_FALSE(d.pairwise);
}

TEST(CommChecked, EncodeDecodeRoundTripsEveryField) {
  const Descriptor d = pairwise(at::zeros({6, 3, 2}, at::kBFloat16), {1, 5}, {2, 4});
  const std::optional<Descriptor> back = decode(encode(d));
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->pairwise);
  EXPECT_EQ(back->dtype, "bfloat16");
  EXPECT_EQ(back->trailing, (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(back->input_splits, (std::vector<std::int64_t>{1, 5}));
  EXPECT_EQ(back->output_splits, (std::vector<std::int64_t>{2, 4}));
}

TEST(CommChecked, DecodeRefusesWhatIsNotADescriptor) {
  EXPECT_FALSE(decode("").has_value());
  EXPECT_FALSE(decode("float32|[3]|1,2|2,1").has_value());  // the old text form
  EXPECT_FALSE(decode("[1, 2]").has_value());
  EXPECT_FALSE(decode(R"({"call": 3, "pairwise": false, "dtype": "float32",
                          "trailing": [], "input_splits": [], "output_splits": []})")
                   .has_value());
  EXPECT_FALSE(decode(R"({"call": "x", "pairwise": false, "dtype": "float32",
                          "trailing": [1.5], "input_splits": [], "output_splits": []})")
                   .has_value());
  EXPECT_FALSE(decode(R"({"call": "x", "pairwise": false, "dtype": "float32"})").has_value());
}

TEST(CommChecked, AgreeingRanksGiveNoDisagreement) {
  const Descriptor d = describe_tensor_call(at::zeros({2}, at::kFloat));
  EXPECT_EQ(disagreement(Descriptors{d, d, d}, 3), "");
  const Descriptors pair{pairwise(at::zeros({3, 2}), {1, 2}, {1, 3}),
                         pairwise(at::zeros({5, 2}), {3, 2}, {2, 2})};
  EXPECT_EQ(disagreement(pair, 2), "");
}

TEST(CommChecked, DisagreeingShapesNameEachGroupOfRanks) {
  const Descriptor a = describe_tensor_call(at::zeros({2}, at::kFloat));
  const Descriptor b = describe_tensor_call(at::zeros({3}, at::kFloat));
  EXPECT_EQ(disagreement(Descriptors{a, b, a}, 3), "ranks 0, 2: float32 [2]; rank 1: float32 [3]");
}

TEST(CommChecked, SplitsThatDoNotPairNameTheSenderAndReceiver) {
  // Rank 0 sends 2 rows to rank 1, which expects 1 from rank 0.
  const Descriptors pair{pairwise(at::zeros({3, 2}), {1, 2}, {1, 3}),
                         pairwise(at::zeros({5, 2}), {3, 2}, {1, 2})};
  EXPECT_EQ(disagreement(pair, 2), "rank 0 sends 2 rows to rank 1, which expects 1");
}

TEST(CommChecked, APairwiseRankAmongPlainOnesDisagrees) {
  const Descriptor a = describe_tensor_call(at::zeros({2}, at::kFloat));
  const Descriptor p = pairwise(at::zeros({2}, at::kFloat), {1, 1}, {1, 1});
  EXPECT_NE(disagreement(Descriptors{a, p}, 2), "");
  EXPECT_NE(disagreement(Descriptors{p, a}, 2), "");
}

TEST(CommChecked, ARankThatPostedGarbageIsNamed) {
  const Descriptor a = describe_tensor_call(at::zeros({2}, at::kFloat));
  EXPECT_EQ(disagreement(Descriptors{a, std::nullopt}, 2),
            "rank 1 posted something that is not a call description");
}

}  // namespace
}  // namespace keel::comm::detail
