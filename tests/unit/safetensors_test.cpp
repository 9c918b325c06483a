// keel-compat's file codec: round trips, and every kind of bad file gives
// corrupt_data naming the offset, never a crash.
#include <cstdio>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "engine/safetensors.h"

namespace keel::harness {
namespace {

TensorFile sample() {
  TensorFile f;
  f.tensors["a/f64"] = at::randn({3, 4}, at::kDouble);
  f.tensors["b/f32"] = at::randn({5}, at::kFloat).t();
  f.tensors["c/bf16"] = at::randn({2, 3}).to(at::kBFloat16);
  f.tensors["d/f16"] = at::randn({7}).to(at::kHalf);
  f.tensors["e/i64"] = at::arange(6, at::kLong).reshape({2, 3});
  f.tensors["f/bool"] = at::rand({4}) > 0.5;
  f.tensors["g/empty"] = at::zeros({0, 3});
  f.tensors["h/scalar"] = at::full({}, 2.5);
  f.tensors["i/transposed"] = at::randn({3, 5}).t();  // non-contiguous
  f.metadata["keel_format"] = "1";
  return f;
}

std::string encoded() {
  return encode_safetensors(sample()).value();
}

void expect_corrupt(const std::string& bytes, const std::string& mentions) {
  result<TensorFile> r = decode_safetensors(bytes);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Errc::corrupt_data);
  EXPECT_NE(r.error().message().find("at byte "), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find(mentions), std::string::npos) << r.error().message();
}

TEST(Safetensors, RoundTripsEveryDtypeBitwise) {
  const TensorFile f = sample();
  result<TensorFile> back = decode_safetensors(encode_safetensors(f).value());
  ASSERT_TRUE(back) << back.error().to_string();
  ASSERT_EQ(back.value().tensors.size(), f.tensors.size());
  for (const auto& [name, t] : f.tensors) {
    const at::Tensor& u = back.value().tensors.at(name);
    EXPECT_EQ(u.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(u.sizes(), t.sizes()) << name;
    EXPECT_TRUE(at::equal(u, t)) << name;
  }
  EXPECT_EQ(back.value().metadata, f.metadata);
}

TEST(Safetensors, HeaderIsPaddedToEightBytesAndDataTilesExactly) {
  const std::string bytes = encoded();
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
}

TEST(Safetensors, EncodingIsDeterministic) {
  const TensorFile f = sample();
  EXPECT_EQ(encode_safetensors(f).value(), encode_safetensors(f).value());
}

TEST(Safetensors, TruncatedAnywhereIsCorruptNotACrash) {
  const std::string bytes = encoded();
  for (std::size_t keep = 0; keep < bytes.size();
       keep += std::max<std::size_t>(1, bytes.size() / 97)) {
    SCOPED_TRACE(keep);
    EXPECT_FALSE(decode_safetensors(bytes.substr(0, keep)));
  }
  expect_corrupt(bytes.substr(0, 5), "fewer than the 8");
  expect_corrupt(bytes.substr(0, bytes.size() - 1), "outside");
}

TEST(Safetensors, ForeignFilesAreCorrupt) {
  expect_corrupt(std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16), "header claims");
  std::string json_array = std::string("\x02\0\0\0\0\0\0\0[]", 10);
  expect_corrupt(json_array, "not a JSON object");
  std::string huge = encoded();
  huge[7] = '\x7f';
  expect_corrupt(huge, "header claims");
}

TEST(Safetensors, LyingEntriesAreCorrupt) {
  const auto with_header = [](const std::string& json, std::size_t data_bytes) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    return out + json + std::string(data_bytes, '\0');
  };
  expect_corrupt(with_header(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4),
                 "needs 8");
  expect_corrupt(with_header(R"({"x":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1),
                 "unknown dtype");
  expect_corrupt(with_header(R"({"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1),
                 "non-negative");
  expect_corrupt(
      with_header(
          R"({"x":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,1]}})",
          1),
      "overflows");
  expect_corrupt(with_header(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3), "gap");
  expect_corrupt(
      with_header(
          R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"y":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
          3),
      "overlap");
  expect_corrupt(with_header(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 2),
                 "after the last");
  expect_corrupt(with_header(R"({"x":{"dtype":"U8","shape":[1]}})", 1), "data_offsets");
  expect_corrupt(with_header(R"({"__metadata__":{"k":1}})", 0), "not a string");
  // Found by tests/fuzz/safetensors_fuzz.cpp: the writer refuses an empty
  // name, so a file holding one must not read as valid either.
  expect_corrupt(with_header(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1),
                 "empty name");
}

TEST(Safetensors, UnwritablePathIsIoError) {
  result<void> r = write_safetensors("/nonexistent-dir/x.safetensors", sample());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Errc::io_error);
  EXPECT_NE(r.error().message().find("/nonexistent-dir/x.safetensors"), std::string::npos);
  result<TensorFile> missing = read_safetensors("/nonexistent-dir/x.safetensors");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), Errc::io_error);
}

}  // namespace
}  // namespace keel::harness
