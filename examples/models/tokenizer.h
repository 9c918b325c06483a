// Byte-level BPE (GPT-2's scheme, as Llama-family models such as SmolLM2
// use it), read from a Hugging Face `tokenizer.json`, and the ChatML chat
// template. Equal, id for id, to HF `tokenizers` on the same file
// (tests/models/tokenizer_test.cpp checks a corpus against it).
//
//   auto tok = models::Tokenizer::load(dir + "/tokenizer.json");
//   if (!tok) return tok.error();
//   std::vector<std::int64_t> ids = tok->encode("Hello, world!");
//   std::string text = tok->decode(ids);  // "Hello, world!"
//
// What encode does, in HF's order:
//   1. Invalid UTF-8 becomes U+FFFD, one per maximal ill-formed subsequence
//      (as Python's `bytes.decode("utf-8", "replace")`: what a Python
//      service hands HF tokenizers). Valid text is untouched.
//   2. Added tokens (`<|im_start|>`, ...) are cut out wherever they occur,
//      leftmost and longest first, and map to their ids.
//   3. The pre-tokenizer splits the rest: with `Digits` (individual) every
//      number character stands alone; then GPT-2's pattern
//      `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
//   4. Each piece's UTF-8 bytes become byte symbols, merged by rank. A
//      byte the vocabulary has no token for is dropped, as HF's BPE drops
//      it when there is no unknown token (SmolLM2 has none for 21 bytes,
//      among them the controls 0x04, 0x06, 0x13, 0x14, 0x16 and 0x1D, and
//      the lead bytes 0xF1 and 0xF2 of planes 4 to 12).
// The pre-tokenizers keel reads are exactly those: `ByteLevel`, or
// `Sequence[Digits(individual_digits), ByteLevel]` (SmolLM2's `smollm`);
// any other configuration is refused at load, never approximated.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "keel/v1/error.h"

namespace models {

/// A byte-level BPE tokenizer. Immutable after load: encode and decode may
/// run on any number of threads at once.
class Tokenizer {
 public:
  /// Reads a Hugging Face `tokenizer.json` (BPE model, byte-level). An
  /// unreadable, malformed or unsupported file is an error naming it.
  static keel::result<Tokenizer> load(const std::string& path);

  /// Token ids of `text` (any bytes; see the file comment for invalid
  /// UTF-8). Added tokens written in the text are recognised.
  [[nodiscard]] std::vector<std::int64_t> encode(std::string_view text) const;

  /// The bytes the ids stand for, concatenated: `decode(encode(x)) == x`
  /// for valid UTF-8 `x` whose every byte has a token. A prefix of a sequence may end inside a
  /// character (streaming callers hold back an incomplete tail). An id
  /// outside the vocabulary is `invalid_argument`.
  [[nodiscard]] keel::result<std::string> decode(const std::vector<std::int64_t>& ids) const;

  /// The id of a token written as text (an added token such as
  /// `<|im_end|>`, or a vocabulary entry in byte-level spelling); -1 if none.
  [[nodiscard]] std::int64_t token_id(std::string_view token) const;

  /// Entries in the vocabulary (added tokens included).
  [[nodiscard]] std::int64_t vocab_size() const { return static_cast<std::int64_t>(bytes_.size()); }

  /// Whether `id` is an added token marked special (never produced by merges).
  [[nodiscard]] bool is_special(std::int64_t id) const;

 private:
  struct Merge {
    std::int32_t rank;
    std::int32_t merged;
  };
  void encode_piece(std::string_view bytes, std::vector<std::int64_t>& out) const;
  void encode_ordinary(const std::vector<char32_t>& cps, std::size_t begin, std::size_t end,
                       std::vector<std::int64_t>& out) const;

  bool split_digits_ = false;
  std::vector<std::string> bytes_;                         // id -> the bytes it stands for
  std::vector<bool> special_;                              // id -> added token marked special
  std::int32_t byte_token_[256] = {};                      // byte -> the id of its one-byte token
  std::unordered_map<std::uint64_t, Merge> merges_;        // (left << 32 | right) -> merge
  std::unordered_map<std::string, std::int64_t> by_text_;  // token text -> id
  std::vector<std::pair<std::vector<char32_t>, std::int64_t>> added_;  // longest first
};

/// The tokens that end a generated text: the model's end of sequence
/// (`eos_token_id`, if >= 0) and the tokenizer's `<|im_end|>` and
/// `<|endoftext|>` where it has them, each once.
std::vector<std::int64_t> stop_tokens(const Tokenizer& tokenizer, std::int64_t eos_token_id);

/// One message of a conversation.
struct ChatMessage {
  std::string role;  ///< "system", "user" or "assistant"
  std::string content;
};

/// The ChatML template (`<|im_start|>role\ncontent<|im_end|>\n`), with the
/// system message a model's template inserts when a conversation has none.
/// Rendered byte-equal to transformers' `apply_chat_template`.
class ChatTemplate {
 public:
  /// Recognises a Jinja chat template as ChatML and reads its default
  /// system message; any other template is `invalid_argument` (keel renders
  /// the templates it knows, and does not interpret Jinja).
  static keel::result<ChatTemplate> from_jinja(const std::string& jinja);

  /// The prompt text; with `add_generation_prompt`, ends with the opening
  /// of the assistant's turn.
  [[nodiscard]] std::string render(const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt) const;

 private:
  std::string default_system_;
};

}  // namespace models
