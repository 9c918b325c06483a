#include "tokenizer.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <queue>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

namespace models {
namespace {

struct CodePointRange {
  char32_t first, last;
};
#include "unicode_tables.inc"

template <std::size_t N>
bool in_ranges(const CodePointRange (&ranges)[N], char32_t c) {
  const auto* it =
      std::upper_bound(std::begin(ranges), std::end(ranges), c,
                       [](char32_t v, const CodePointRange& r) { return v < r.first; });
  return it != std::begin(ranges) && c <= std::prev(it)->last;
}

// Unicode's White_Space property: what `\s` matches in HF's pattern engine.
bool is_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}
bool is_letter(char32_t c) {
  return in_ranges(kLetterRanges, c);
}
bool is_number(char32_t c) {
  return in_ranges(kNumberRanges, c);
}

enum class Class { letter, number, space, other };
Class classify(char32_t c) {
  if (is_letter(c)) return Class::letter;
  if (is_number(c)) return Class::number;
  if (is_space(c)) return Class::space;
  return Class::other;
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// UTF-8 to code points; each maximal ill-formed subsequence becomes one
// U+FFFD (Unicode's "substitution of maximal subparts", Python's "replace").
std::vector<char32_t> decode_utf8(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    int need = 0;
    char32_t c = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1, c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2, c = b & 0x0F;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3, c = b & 0x07;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    std::size_t j = i + 1;
    bool ok = true;
    for (int k = 0; k < need; ++k, ++j) {
      const unsigned char lo_k = k == 0 ? lo : 0x80, hi_k = k == 0 ? hi : 0xBF;
      if (j >= n || p[j] < lo_k || p[j] > hi_k) {
        ok = false;
        break;
      }
      c = (c << 6) | (p[j] & 0x3F);
    }
    out.push_back(ok ? c : 0xFFFD);
    i = j;
  }
  return out;
}

// GPT-2's reversible map from bytes to printable code points.
std::vector<char32_t> byte_to_code_point() {
  std::vector<char32_t> map(256);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    map[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

keel::Error bad_file(const std::string& path, const std::string& what) {
  return {keel::Errc::corrupt_data, path + ": " + what};
}

}  // namespace

keel::result<Tokenizer> Tokenizer::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return keel::Error(keel::Errc::io_error, "cannot open " + path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad_file(path, "not a JSON object");
  const auto& model = j.value("model", nlohmann::json::object());
  if (model.value("type", "") != "BPE" || !model.contains("vocab") || !model["vocab"].is_object() ||
      !model.contains("merges") || !model["merges"].is_array()) {
    return bad_file(path, "model is not a BPE with a vocab and merges");
  }
  if (model.value("byte_fallback", false) || model.value("ignore_merges", false) ||
      !model.value("continuing_subword_prefix", nlohmann::json()).is_null() ||
      !model.value("end_of_word_suffix", nlohmann::json()).is_null()) {
    return keel::Error(keel::Errc::invalid_argument,
                       path +
                           ": a BPE option keel does not implement is set (byte_fallback, "
                           "ignore_merges, continuing_subword_prefix or end_of_word_suffix)");
  }
  if (!j.value("normalizer", nlohmann::json()).is_null()) {
    return keel::Error(keel::Errc::invalid_argument, path + ": a normalizer is set");
  }
  Tokenizer t;
  // The pre-tokenizer: ByteLevel, optionally after Digits(individual_digits).
  const auto& pre = j.value("pre_tokenizer", nlohmann::json());
  std::vector<nlohmann::json> steps;
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers")) {
    for (const auto& s : pre["pretokenizers"]) steps.push_back(s);
  } else if (pre.is_object()) {
    steps.push_back(pre);
  }
  const bool shape_ok =
      (steps.size() == 1 || (steps.size() == 2 && steps[0].value("type", "") == "Digits" &&
                             steps[0].value("individual_digits", false))) &&
      steps.back().value("type", "") == "ByteLevel" &&
      !steps.back().value("add_prefix_space", true) && steps.back().value("use_regex", false);
  if (!shape_ok) {
    return keel::Error(keel::Errc::invalid_argument,
                       path +
                           ": pre_tokenizer is not ByteLevel (no prefix space, GPT-2 pattern), "
                           "alone or after Digits(individual_digits)");
  }
  t.split_digits_ = steps.size() == 2;

  // The vocabulary, in byte-level spelling, turned back into bytes.
  const std::vector<char32_t> to_cp = byte_to_code_point();
  std::unordered_map<char32_t, unsigned char> to_byte;
  for (int b = 0; b < 256; ++b)
    to_byte[to_cp[static_cast<std::size_t>(b)]] = static_cast<unsigned char>(b);
  const auto& vocab = model["vocab"];
  const auto size = static_cast<std::int64_t>(vocab.size());
  t.bytes_.assign(static_cast<std::size_t>(size), std::string());
  std::vector<bool> seen(static_cast<std::size_t>(size), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) return bad_file(path, "vocab id of '" + it.key() + "'");
    const auto id = it.value().get<std::int64_t>();
    if (id < 0 || id >= size || seen[static_cast<std::size_t>(id)]) {
      return bad_file(path, "vocab ids are not 0.." + std::to_string(size - 1) + " once each");
    }
    seen[static_cast<std::size_t>(id)] = true;
    std::string& bytes = t.bytes_[static_cast<std::size_t>(id)];
    for (const char32_t c : decode_utf8(it.key())) {
      const auto b = to_byte.find(c);
      if (b == to_byte.end()) {
        bytes.clear();  // not byte-level spelling: an added token's text
        break;
      }
      bytes += static_cast<char>(b->second);
    }
    t.by_text_.emplace(it.key(), id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string spelled;
    append_utf8(to_cp[static_cast<std::size_t>(b)], spelled);
    const auto it = t.by_text_.find(spelled);
    // A byte may have no token (SmolLM2 lacks 21, among them 0x04 and
    // 0xF1): HF's BPE without an unknown token drops such a byte, and so
    // does keel.
    t.byte_token_[b] = it == t.by_text_.end() ? -1 : static_cast<std::int32_t>(it->second);
  }
  // Merges: "left right" (or [left, right]) in rank order.
  std::int32_t rank = 0;
  for (const auto& m : model["merges"]) {
    std::string left, right;
    if (m.is_string()) {
      const auto s = m.get<std::string>();
      const auto space = s.find(' ');
      if (space == std::string::npos) return bad_file(path, "merge '" + s + "' has no space");
      left = s.substr(0, space), right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    } else {
      return bad_file(path, "a merge is neither \"a b\" nor [a, b]");
    }
    const auto l = t.by_text_.find(left), r = t.by_text_.find(right),
               merged = t.by_text_.find(left + right);
    if (l == t.by_text_.end() || r == t.by_text_.end() || merged == t.by_text_.end()) {
      std::string what = "merge '";
      what.append(left).append(" ").append(right).append("' names a token not in the vocab");
      return bad_file(path, what);
    }
    const std::uint64_t key =
        (static_cast<std::uint64_t>(l->second) << 32) | static_cast<std::uint64_t>(r->second);
    t.merges_.emplace(key, Merge{rank++, static_cast<std::int32_t>(merged->second)});
  }
  // Added tokens: matched in the raw text, longest first.
  t.special_.assign(static_cast<std::size_t>(size), false);
  for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
    const auto id = a.value("id", std::int64_t{-1});
    const auto content = a.value("content", std::string());
    if (id < 0 || id >= size || content.empty()) return bad_file(path, "an added token");
    if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false) ||
        a.value("normalized", false)) {
      std::string what = path;
      what.append(": added token ")
          .append(content)
          .append(" has lstrip, rstrip, single_word or normalized set");
      return keel::Error(keel::Errc::invalid_argument, what);
    }
    t.bytes_[static_cast<std::size_t>(id)] = content;
    t.special_[static_cast<std::size_t>(id)] = a.value("special", false);
    t.by_text_[content] = id;
    t.added_.emplace_back(decode_utf8(content), id);
  }
  std::stable_sort(t.added_.begin(), t.added_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return t;
}

std::int64_t Tokenizer::token_id(std::string_view token) const {
  const auto it = by_text_.find(std::string(token));
  return it == by_text_.end() ? -1 : it->second;
}

bool Tokenizer::is_special(std::int64_t id) const {
  return id >= 0 && id < vocab_size() && special_[static_cast<std::size_t>(id)];
}

// BPE over one pre-tokenized piece: the adjacent pair of lowest rank merges
// first (leftmost among equals), as HF's BPE does, in O(n log n).
void Tokenizer::encode_piece(std::string_view bytes, std::vector<std::int64_t>& out) const {
  struct Symbol {
    std::int32_t id;
    std::int32_t prev, next;  // -1 at the ends
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(bytes.size());
  for (const char byte : bytes) {
    const std::int32_t id = byte_token_[static_cast<unsigned char>(byte)];
    if (id < 0) continue;  // a byte without a token is dropped
    const auto i = static_cast<std::int32_t>(sym.size());
    sym.push_back({id, i - 1, i + 1, true});
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  struct Candidate {
    std::int32_t rank, pos, merged, right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](std::int32_t pos) {
    if (pos < 0 || sym[static_cast<std::size_t>(pos)].next < 0) return;
    const Symbol& a = sym[static_cast<std::size_t>(pos)];
    const Symbol& b = sym[static_cast<std::size_t>(a.next)];
    const auto it =
        merges_.find((static_cast<std::uint64_t>(a.id) << 32) | static_cast<std::uint64_t>(b.id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.merged, b.id});
  };
  for (std::size_t i = 0; i + 1 < sym.size(); ++i) consider(static_cast<std::int32_t>(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& a = sym[static_cast<std::size_t>(c.pos)];
    // Stale: the left symbol was merged away or changed, or its right
    // neighbour is no longer the symbol this candidate was made with.
    if (!a.alive || a.next < 0) continue;
    Symbol& b = sym[static_cast<std::size_t>(a.next)];
    const auto it =
        merges_.find((static_cast<std::uint64_t>(a.id) << 32) | static_cast<std::uint64_t>(b.id));
    if (b.id != c.right_id || it == merges_.end() || it->second.merged != c.merged) continue;
    a.id = c.merged;
    b.alive = false;
    a.next = b.next;
    if (b.next >= 0) sym[static_cast<std::size_t>(b.next)].prev = c.pos;
    consider(a.prev);
    consider(c.pos);
  }
  for (std::int32_t i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) {
    out.push_back(sym[static_cast<std::size_t>(i)].id);
  }
}

// The pre-tokenizer over cps[begin, end), then BPE on each piece.
void Tokenizer::encode_ordinary(const std::vector<char32_t>& cps, std::size_t begin,
                                std::size_t end, std::vector<std::int64_t>& out) const {
  std::string piece;
  auto emit = [&](std::size_t a, std::size_t b) {
    piece.clear();
    for (std::size_t i = a; i < b; ++i) append_utf8(cps[i], piece);
    encode_piece(piece, out);
  };
  // GPT-2's pattern over [a, b), matched the way a backtracking engine
  // matches it: the first alternative that matches at a position wins.
  auto split = [&](std::size_t a, std::size_t b) {
    std::size_t i = a;
    while (i < b) {
      const char32_t c = cps[i];
      // 's 't 're 've 'm 'll 'd
      if (c == U'\'' && i + 1 < b) {
        const char32_t n = cps[i + 1];
        std::size_t len = 0;
        if (n == U's' || n == U't' || n == U'm' || n == U'd') {
          len = 2;
        } else if (i + 2 < b &&
                   ((n == U'r' && cps[i + 2] == U'e') || (n == U'v' && cps[i + 2] == U'e') ||
                    (n == U'l' && cps[i + 2] == U'l'))) {
          len = 3;
        }
        if (len > 0) {
          emit(i, i + len);
          i += len;
          continue;
        }
      }
      // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
      std::size_t start = i;
      if (c == U' ' && i + 1 < b && classify(cps[i + 1]) != Class::space) ++start;
      const Class cls = classify(cps[start]);
      if (cls != Class::space) {
        std::size_t j = start + 1;
        while (j < b && classify(cps[j]) == cls) ++j;
        emit(i, j);
        i = j;
        continue;
      }
      // `\s+(?!\S)`, then `\s+`: a run of spaces leaves its last one to the
      // word that follows it.
      std::size_t j = i + 1;
      while (j < b && is_space(cps[j])) ++j;
      if (j < b && j - i >= 2) --j;
      emit(i, j);
      i = j;
    }
  };
  if (!split_digits_) {
    split(begin, end);
    return;
  }
  std::size_t a = begin;
  for (std::size_t i = begin; i < end; ++i) {
    if (is_number(cps[i])) {
      split(a, i);
      emit(i, i + 1);
      a = i + 1;
    }
  }
  split(a, end);
}

std::vector<std::int64_t> Tokenizer::encode(std::string_view text) const {
  const std::vector<char32_t> cps = decode_utf8(text);
  // Added tokens are matched on the code points (after replacement).
  std::vector<std::int64_t> out;
  std::size_t from = 0;
  for (std::size_t i = 0; i < cps.size();) {
    std::size_t matched = 0;
    std::int64_t matched_id = -1;
    for (const auto& [a, id] : added_) {
      if (a.front() == cps[i] && a.size() <= cps.size() - i &&
          std::equal(a.begin(), a.end(), cps.begin() + static_cast<std::ptrdiff_t>(i))) {
        matched = a.size();
        matched_id = id;
        break;
      }
    }
    if (matched == 0) {
      ++i;
      continue;
    }
    encode_ordinary(cps, from, i, out);
    out.push_back(matched_id);
    i += matched;
    from = i;
  }
  encode_ordinary(cps, from, cps.size(), out);
  return out;
}

keel::result<std::string> Tokenizer::decode(const std::vector<std::int64_t>& ids) const {
  std::string out;
  for (const std::int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return keel::Error(keel::Errc::invalid_argument, "decode: token id " + std::to_string(id) +
                                                           " is outside the vocabulary of " +
                                                           std::to_string(vocab_size()));
    }
    out += bytes_[static_cast<std::size_t>(id)];
  }
  return out;
}

keel::result<ChatTemplate> ChatTemplate::from_jinja(const std::string& jinja) {
  // ChatML as Hugging Face writes it: each message as
  // '<|im_start|>' + role + '\n' + content + '<|im_end|>' + '\n', a
  // system message first when the conversation has none, and the
  // assistant's opening as the generation prompt.
  const std::string message =
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}";
  const std::string generation = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}";
  const std::string system_open =
      "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n";
  const std::string system_close = "<|im_end|>\n' }}{% endif %}";
  const auto open = jinja.find(system_open);
  const auto close = open == std::string::npos ? open : jinja.find(system_close, open);
  if (jinja.find(message) == std::string::npos || jinja.find(generation) == std::string::npos ||
      close == std::string::npos) {
    return keel::Error(keel::Errc::invalid_argument,
                       "chat template: not the ChatML template keel renders (messages as "
                       "<|im_start|>role\\ncontent<|im_end|>\\n with a default system message)");
  }
  ChatTemplate t;
  t.default_system_ = jinja.substr(open + system_open.size(), close - open - system_open.size());
  if (t.default_system_.find('\'') != std::string::npos ||
      t.default_system_.find('\\') != std::string::npos) {
    return keel::Error(keel::Errc::invalid_argument,
                       "chat template: the default system message has quotes or escapes");
  }
  return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  std::string out;
  if (!messages.empty() && messages.front().role != "system") {
    out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  }
  for (const ChatMessage& m : messages) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::vector<std::int64_t> stop_tokens(const Tokenizer& tokenizer, std::int64_t eos_token_id) {
  std::vector<std::int64_t> out;
  for (const std::int64_t id :
       {eos_token_id, tokenizer.token_id("<|im_end|>"), tokenizer.token_id("<|endoftext|>")}) {
    if (id >= 0 && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
  return out;
}

}  // namespace models
