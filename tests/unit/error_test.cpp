#include <gtest/gtest.h>
#include <keel/keel.h>

namespace keel {
namespace {

result<int> half_of(int x) {
  if (x % 2 != 0) return Error(Errc::invalid_argument, "half_of: x is odd");
  return x / 2;
}

TEST(Result, HoldsValueOrError) {
  result<int> ok = half_of(4);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok.value(), 2);
  result<int> bad = half_of(3);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code(), Errc::invalid_argument);
  EXPECT_EQ(bad.error().message(), "half_of: x is odd");
  EXPECT_EQ(bad.error().to_string(), "invalid_argument: half_of: x is odd");
}

TEST(Result, ValueOnErrorThrowsBadResultAccessCarryingTheError) {
  result<int> bad = half_of(3);
  try {
    (void)bad.value();
    FAIL() << "value() on an error did not throw";
  } catch (const BadResultAccess& e) {
    EXPECT_EQ(e.error().code(), Errc::invalid_argument);
    EXPECT_STREQ(e.what(), "invalid_argument: half_of: x is odd");
  }
}

TEST(Result, ErrorOnValueThrowsBadResultAccess) {
  result<int> ok = half_of(2);
  EXPECT_THROW((void)ok.error(), BadResultAccess);
}

TEST(Result, VoidResult) {
  const auto check = [](bool fail) -> result<void> {
    if (fail) return Error(Errc::timeout, "wait: 5 s passed");
    return success();
  };
  EXPECT_TRUE(check(false));
  ASSERT_FALSE(check(true));
  EXPECT_EQ(check(true).error().code(), Errc::timeout);
  EXPECT_THROW(check(true).value(), BadResultAccess);
}

TEST(Errc, EveryCodeHasItsName) {
  EXPECT_EQ(to_string(Errc::invalid_argument), "invalid_argument");
  EXPECT_EQ(to_string(Errc::unsupported), "unsupported");
  EXPECT_EQ(to_string(Errc::timeout), "timeout");
  EXPECT_EQ(to_string(Errc::peer_lost), "peer_lost");
  EXPECT_EQ(to_string(Errc::aborted), "aborted");
  EXPECT_EQ(to_string(Errc::backend_error), "backend_error");
  EXPECT_EQ(to_string(Errc::io_error), "io_error");
  EXPECT_EQ(to_string(Errc::corrupt_data), "corrupt_data");
}

}  // namespace
}  // namespace keel
