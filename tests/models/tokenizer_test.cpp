// keel's byte-level BPE tokenizer and ChatML template against the
// reference tests/models/make_reference.py wrote with HF tokenizers and
// transformers (scripts/model-reference.sh): every text of the corpus gives
// the same ids, every id decodes back to the text, every conversation
// renders to the same bytes. One named case per text and per conversation.
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer.h"

namespace {

const nlohmann::json& reference() {
  static const nlohmann::json j = [] {
    std::ifstream in(KEEL_MODEL_REFERENCE_DIR "/tokenizer-reference.json");
    return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }();
  return j;
}

std::vector<std::string> names(const char* list) {
  std::vector<std::string> out;
  if (!reference().is_object()) return {"reference_missing"};
  for (const auto& e : reference()[list]) out.push_back(e["name"].get<std::string>());
  return out;
}

const nlohmann::json* entry(const char* list, const std::string& name) {
  if (!reference().is_object()) return nullptr;
  for (const auto& e : reference()[list]) {
    if (e["name"] == name) return &e;
  }
  return nullptr;
}

std::string base64_decode(const std::string& in) {
  std::string out;
  int bits = 0;
  std::uint32_t value = 0;  // the bits not yet written, at most 14
  for (const char c : in) {
    int d = -1;
    if (c >= 'A' && c <= 'Z') d = c - 'A';
    if (c >= 'a' && c <= 'z') d = c - 'a' + 26;
    if (c >= '0' && c <= '9') d = c - '0' + 52;
    if (c == '+') d = 62;
    if (c == '/') d = 63;
    if (d < 0) continue;  // '=' padding
    value = ((value << 6) | static_cast<std::uint32_t>(d)) & 0x3FFFu;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((value >> bits) & 0xFF);
    }
  }
  return out;
}

// A byte's token as GPT-2's byte-level scheme spells it.
std::string byte_level(char c) {
  const auto b = static_cast<unsigned char>(c);
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  unsigned cp = b;
  if (!printable) {
    cp = 256;
    for (unsigned x = 0; x < b; ++x) {
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++cp;
    }
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

const models::Tokenizer& tokenizer() {
  static const keel::result<models::Tokenizer> t =
      models::Tokenizer::load(KEEL_MODEL_DIR "/tokenizer.json");
  if (!t) ADD_FAILURE() << t.error().to_string();
  return t.value();
}

class TokenizerConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerConformance, IdsEqualHfTokenizersAndDecodeRoundTrips) {
  const nlohmann::json* e = entry("texts", GetParam());
  ASSERT_NE(e, nullptr) << "no reference: run scripts/model-reference.sh";
  const std::string raw = base64_decode((*e)["bytes_b64"].get<std::string>());
  const std::string text = (*e)["text"].get<std::string>();  // invalid UTF-8 replaced
  const auto expected = (*e)["ids"].get<std::vector<std::int64_t>>();
  const std::vector<std::int64_t> ids = tokenizer().encode(raw);
  ASSERT_EQ(ids.size(), expected.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(ids[i], expected[i]) << "first difference at token " << i;
  }
  const keel::result<std::string> back = tokenizer().decode(ids);
  ASSERT_TRUE(back) << back.error().to_string();
  // decode(encode(x)) == x, once invalid UTF-8 is replaced and the bytes
  // the vocabulary has no token for are dropped (as HF does).
  std::string kept;
  for (const char c : text) {
    if (tokenizer().token_id(byte_level(c)) >= 0) kept += c;
  }
  EXPECT_EQ(back.value(), kept);
}

INSTANTIATE_TEST_SUITE_P(Corpus, TokenizerConformance, ::testing::ValuesIn(names("texts")),
                         [](const auto& info) { return info.param; });

class ChatTemplateConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateConformance, RendersAsTransformersApplyChatTemplate) {
  const nlohmann::json* e = entry("chats", GetParam());
  ASSERT_NE(e, nullptr) << "no reference: run scripts/model-reference.sh";
  std::ifstream in(KEEL_MODEL_DIR "/chat_template.jinja");
  const std::string jinja((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const keel::result<models::ChatTemplate> chat = models::ChatTemplate::from_jinja(jinja);
  ASSERT_TRUE(chat) << chat.error().to_string();
  std::vector<models::ChatMessage> messages;
  for (const auto& m : (*e)["messages"]) {
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  EXPECT_EQ(chat.value().render(messages, /*add_generation_prompt=*/true),
            (*e)["rendered"].get<std::string>());
}

INSTANTIATE_TEST_SUITE_P(Conversations, ChatTemplateConformance,
                         ::testing::ValuesIn(names("chats")),
                         [](const auto& info) { return info.param; });

TEST(TokenizerBadInput, DecodeRefusesAnIdOutsideTheVocabulary) {
  const keel::result<std::string> r = tokenizer().decode({1, tokenizer().vocab_size()});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), keel::Errc::invalid_argument);
  EXPECT_FALSE(tokenizer().decode({-1}));
}

TEST(TokenizerBadInput, AMissingOrCorruptFileIsAnErrorNamingIt) {
  const auto missing = models::Tokenizer::load("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), keel::Errc::io_error);
  EXPECT_NE(missing.error().message().find("/nonexistent/tokenizer.json"), std::string::npos);
  const std::string path = ::testing::TempDir() + "/truncated-tokenizer.json";
  {
    std::ifstream in(KEEL_MODEL_DIR "/tokenizer.json", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  const auto truncated = models::Tokenizer::load(path);
  ASSERT_FALSE(truncated);
  EXPECT_EQ(truncated.error().code(), keel::Errc::corrupt_data);
  EXPECT_NE(truncated.error().message().find(path), std::string::npos);
}

TEST(TokenizerBadInput, AnotherChatTemplateIsRefused) {
  EXPECT_FALSE(models::ChatTemplate::from_jinja("{{ messages[0]['content'] }}"));
}

}  // namespace
