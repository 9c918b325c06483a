// keel-generate: a Llama-family model (SmolLM2-135M-Instruct by default) on
// keel, from the command line.
//
//   keel-generate [--model DIR] [--dtype float32|bfloat16] [--max-tokens N] [--chat]
//                 [--threads N] [--json F] PROMPT...
//       greedy continuations of each prompt (with --chat, each prompt is one
//       user turn rendered with the model's chat template), until a stop
//       token (models::stop_tokens) or N tokens; --json writes each prompt's
//       tokens and text
//   keel-generate --record FILE | --compare FILE [--json F] [--texts F]
//       the upgrade check (docs/compat.md): the last-position logits and 32
//       greedy tokens of fixed prompts, recorded on one release and judged
//       on another (logits within 1e-3 absolute, tokens exact); --texts
//       writes the greedy texts as JSON (with the torch release)
//   keel-generate --bench [--json F]
//       prefill tokens/s at 128 and 1024 tokens, decode tokens/s at 128 and
//       2048 tokens of context, and the process's peak memory
//   keel-generate --bench-serve
//       the same timings on request, for tests/bench/peers/smollm2_peers.py
//
// DIR defaults to $KEEL_DEPS_DIR/models/smollm2-135m-instruct (what
// scripts/fetch-deps.sh converts). Exit status: 0 done, 1 a check failed,
// 2 bad usage or files.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

#include <nlohmann/json.hpp>

#include "keel/v1/build_info.h"
#include "keel/v1/compat.h"
#include "llama.h"
#include "tokenizer.h"

namespace {

struct Options {
  std::string model, record, compare, json, texts;
  std::string dtype = "float32";
  std::int64_t max_tokens = 32, threads = 0;
  bool chat = false, bench = false, bench_serve = false;
  std::vector<std::string> prompts;
};

constexpr std::int64_t kPageSize = 16;
constexpr std::int64_t kCheckTokens = 32;

std::vector<std::int64_t> pages_for(std::int64_t tokens) {
  std::vector<std::int64_t> pages;
  for (std::int64_t p = 0; p * kPageSize < tokens; ++p) pages.push_back(p);
  return pages;
}

// Greedy decoding of one sequence: the prompt's last-position logits and
// `steps` tokens (stopping early at one of `stop` when it is non-empty).
struct Greedy {
  at::Tensor logits;  // [vocab] after the prompt
  std::vector<std::int64_t> tokens;
};
keel::result<Greedy> greedy(const models::Llama& m, const std::vector<std::int64_t>& prompt,
                            std::int64_t steps, const std::vector<std::int64_t>& stop) {
  const auto n = static_cast<std::int64_t>(prompt.size());
  if (n == 0) return keel::Error(keel::Errc::invalid_argument, "the prompt has no tokens");
  models::KVCache cache = m.make_cache((n + steps) / kPageSize + 1, kPageSize);
  const std::vector<std::int64_t> pages = pages_for(n + steps);
  auto hidden = m.step({{prompt, 0, pages}}, cache);
  if (!hidden) return hidden.error();
  Greedy g;
  at::Tensor logits = m.logits(hidden.value().narrow(0, n - 1, 1))[0];
  g.logits = logits;
  for (std::int64_t i = 0; i < steps; ++i) {
    const auto token = logits.argmax().item<std::int64_t>();
    g.tokens.push_back(token);
    if (std::find(stop.begin(), stop.end(), token) != stop.end()) break;
    if (i + 1 == steps) break;
    auto next = m.step({{{token}, n + i, pages}}, cache);
    if (!next) return next.error();
    logits = m.logits(next.value())[0];
  }
  return g;
}

// The upgrade check's prompts: prose, code and a chat turn.
std::vector<std::pair<std::string, std::string>> check_prompts(const models::ChatTemplate& chat) {
  return {{"prose", "The quick brown fox jumps over the lazy dog. The dog"},
          {"code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"},
          {"chat", chat.render({{"user", "What is the capital of France?"}}, true)}};
}

std::int64_t peak_rss_mib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) / 1024;
  }
  return -1;
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

std::vector<std::int64_t> random_tokens(const models::Llama& m, std::int64_t n) {
  const at::Tensor ids = at::randint(m.config().vocab_size, {n}, at::kLong);
  return {ids.data_ptr<std::int64_t>(), ids.data_ptr<std::int64_t>() + n};
}

// Seconds to prefill n tokens into a fresh cache (one step), or -1.
double time_prefill(const models::Llama& m, std::int64_t n) {
  const std::vector<std::int64_t> prompt = random_tokens(m, n);
  models::KVCache cache = m.make_cache(n / kPageSize + 1, kPageSize);
  const auto t0 = Clock::now();
  if (!m.step({{prompt, 0, pages_for(n)}}, cache)) return -1;
  return seconds_since(t0);
}

// Seconds for `steps` greedy decode steps (logits and argmax included)
// after a context of `ctx` tokens, whose prefill is not timed; or -1.
double time_decode(const models::Llama& m, std::int64_t ctx, std::int64_t steps) {
  const std::vector<std::int64_t> prompt = random_tokens(m, ctx);
  models::KVCache cache = m.make_cache((ctx + steps) / kPageSize + 1, kPageSize);
  const std::vector<std::int64_t> pages = pages_for(ctx + steps);
  if (!m.step({{prompt, 0, pages}}, cache)) return -1;
  const auto t0 = Clock::now();
  std::int64_t token = 1;
  for (std::int64_t i = 0; i < steps; ++i) {
    auto h = m.step({{{token}, ctx + i, pages}}, cache);
    if (!h) return -1;
    token = m.logits(h.value())[0].argmax().item<std::int64_t>();
  }
  return seconds_since(t0);
}

int bench(const models::Llama& m, const Options& o) {
  at::manual_seed(0);
  std::map<std::string, double> out;
  for (const std::int64_t n : {128, 1024}) {  // best of 3
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) best = std::min(best, time_prefill(m, n));
    if (best <= 0) return 2;
    out["prefill_" + std::to_string(n) + "_tokens_per_s"] = static_cast<double>(n) / best;
  }
  const std::int64_t steps = 32;
  for (const std::int64_t n : {128, 2048}) {
    const double s = time_decode(m, n, steps);
    if (s <= 0) return 2;
    out["decode_ctx" + std::to_string(n) + "_tokens_per_s"] = static_cast<double>(steps) / s;
  }
  out["peak_rss_mib"] = static_cast<double>(peak_rss_mib());
  out["threads"] = at::get_num_threads();
  nlohmann::json json = {{"dtype", o.dtype}, {"torch", keel::build_info().torch_version}};
  for (const auto& [k, v] : out) json[k] = v;
  std::cout << json.dump() << "\n";
  if (!o.json.empty()) std::ofstream(o.json) << json.dump(1) << "\n";
  return 0;
}

// The peers' benchmark protocol (tests/bench/peers/smollm2_peers.py): one
// request a line on stdin, one JSON answer a line on stdout.
//   prefill N            {"seconds": s}
//   decode CTX STEPS     {"seconds": s}
//   tokenize PATH        {"seconds": s, "tokens": n}: encoding the file's bytes
int bench_serve(const models::Llama& m, const models::Tokenizer& tok) {
  at::manual_seed(0);
  std::string line;
  std::cout << nlohmann::json({{"ready", true}, {"rss_mib", peak_rss_mib()}}).dump() << std::endl;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string what;
    in >> what;
    std::int64_t a = 0, b = 0;
    double s = -1;
    std::size_t tokens = 0;
    if (what == "prefill" && in >> a && a > 0) s = time_prefill(m, a);
    if (what == "decode" && in >> a >> b && a > 0 && b > 0) s = time_decode(m, a, b);
    if (what == "tokenize") {
      std::string path;
      in >> path;
      std::ifstream file(path, std::ios::binary);
      const std::string text((std::istreambuf_iterator<char>(file)),
                             std::istreambuf_iterator<char>());
      const auto t0 = Clock::now();
      tokens = tok.encode(text).size();
      s = file ? seconds_since(t0) : -1;
    }
    if (what == "quit") return 0;
    nlohmann::json answer = {{"seconds", s}, {"tokens", tokens}, {"rss_mib", peak_rss_mib()}};
    if (s < 0) answer = {{"error", "bad request: " + line}};
    std::cout << answer.dump() << std::endl;
  }
  return 0;
}

int usage(const std::string& why) {
  std::cerr
      << "keel-generate: " << why
      << "\nusage: keel-generate [--model DIR] [--dtype float32|bfloat16] [--max-tokens N] "
         "[--chat] [--threads N] [--json F] PROMPT...\n"
         "       keel-generate [--model DIR] --record FILE | --compare FILE [--json F] "
         "[--texts F]\n"
         "       keel-generate [--model DIR] [--dtype D] --bench [--json F] | --bench-serve\n";
  return 2;
}

int run(int argc, char** argv) {
  Options o;
  o.model = models::default_model_dir();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    std::string* text = a == "--model"     ? &o.model
                        : a == "--record"  ? &o.record
                        : a == "--compare" ? &o.compare
                        : a == "--json"    ? &o.json
                        : a == "--texts"   ? &o.texts
                        : a == "--dtype"   ? &o.dtype
                                           : nullptr;
    if (text != nullptr) {
      const char* v = value();
      if (v == nullptr) return usage(a + " needs a value");
      *text = v;
    } else if (a == "--max-tokens" || a == "--threads") {
      const char* v = value();
      char* end = nullptr;
      const long long n = v == nullptr ? -1 : std::strtoll(v, &end, 10);
      if (v == nullptr || *end != '\0' || n < 1 || n > 1000000) {
        return usage(a + " needs a positive integer");
      }
      (a == "--threads" ? o.threads : o.max_tokens) = n;
    } else if (a == "--chat") {
      o.chat = true;
    } else if (a == "--bench") {
      o.bench = true;
    } else if (a == "--bench-serve") {
      o.bench_serve = true;
    } else if (a.rfind("--", 0) == 0) {
      return usage("unknown option " + a);
    } else {
      o.prompts.push_back(a);
    }
  }
  if (o.dtype != "float32" && o.dtype != "bfloat16") return usage("--dtype is float32 or bfloat16");
  if (!o.record.empty() + !o.compare.empty() + o.bench + o.bench_serve + !o.prompts.empty() != 1) {
    return usage("give prompts, or one of --record, --compare, --bench and --bench-serve");
  }
  if (o.threads > 0) at::set_num_threads(static_cast<int>(o.threads));
  auto model = models::Llama::load(o.model, o.dtype == "float32" ? at::kFloat : at::kBFloat16);
  if (!model) return usage(model.error().to_string());
  auto tokenizer = models::Tokenizer::load(o.model + "/tokenizer.json");
  if (!tokenizer) return usage(tokenizer.error().to_string());
  std::ifstream jinja_in(o.model + "/chat_template.jinja");
  const std::string jinja((std::istreambuf_iterator<char>(jinja_in)),
                          std::istreambuf_iterator<char>());
  auto chat = models::ChatTemplate::from_jinja(jinja);
  if (!chat) return usage(chat.error().to_string());
  const models::Llama& m = model.value();
  const models::Tokenizer& tok = tokenizer.value();

  if (o.bench) return bench(m, o);
  if (o.bench_serve) return bench_serve(m, tok);

  if (!o.prompts.empty()) {
    const std::vector<std::int64_t> stop = models::stop_tokens(tok, m.config().eos_token_id);
    nlohmann::json out = nlohmann::json::array();
    for (const std::string& p : o.prompts) {
      const std::string text = o.chat ? chat.value().render({{"user", p}}, true) : p;
      auto g = greedy(m, tok.encode(text), o.max_tokens, stop);
      if (!g) return usage(g.error().to_string());
      // Neither the stop token nor any special token is text (as keel-serve).
      std::vector<std::int64_t> shown;
      for (const std::int64_t t : g.value().tokens) {
        if (std::find(stop.begin(), stop.end(), t) == stop.end() && !tok.is_special(t)) {
          shown.push_back(t);
        }
      }
      const std::string continuation = tok.decode(shown).value();
      std::cout << p << (o.chat ? "\n-> " : "") << continuation << "\n";
      out.push_back({{"prompt", p}, {"tokens", g.value().tokens}, {"text", continuation}});
    }
    if (!o.json.empty()) {
      std::ofstream(o.json) << out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace)
                            << "\n";
    }
    return 0;
  }

  // The upgrade check: each prompt's ids are stored at record time and
  // replayed as stored.
  nlohmann::json texts = {{"torch", keel::build_info().torch_version},
                          {"texts", nlohmann::json::object()}};
  std::vector<keel::compat::Case> cases;
  for (const auto& [name, text] : check_prompts(chat.value())) {
    keel::compat::Case c;
    c.id = "smollm2/" + name;
    c.inputs.emplace("prompt", at::tensor(tok.encode(text)));
    // Logits are O(10): 1e-3 absolute, the bound against transformers
    // (tests/models/llama_test.cpp); tokens exactly.
    c.output_tolerances["logits"] = keel::compat::Tolerance{1e-3, 0};
    cases.push_back(std::move(c));
  }
  auto function = [&](const keel::compat::Case& c) -> keel::result<keel::compat::Tensors> {
    const at::Tensor p = c.inputs.at("prompt").to(at::kLong).contiguous();
    const std::vector<std::int64_t> prompt(p.data_ptr<std::int64_t>(),
                                           p.data_ptr<std::int64_t>() + p.numel());
    auto g = greedy(m, prompt, kCheckTokens, {});
    if (!g) return g.error();
    keel::compat::Tensors out;
    out.emplace("logits", g.value().logits);
    out.emplace("greedy", at::tensor(g.value().tokens));
    const std::string text = tok.decode(g.value().tokens).value();
    std::cout << c.id << ": " << nlohmann::json(text).dump() << "\n";
    texts["texts"][c.id] = text;
    return out;
  };
  auto write_texts = [&] {
    if (!o.texts.empty()) std::ofstream(o.texts) << texts.dump(1) << "\n";
  };
  if (!o.record.empty()) {
    keel::compat::RecordOptions ro;
    ro.metadata["model"] = o.model;
    keel::result<void> r = keel::compat::record(o.record, cases, function, ro);
    if (!r) return usage(r.error().to_string());
    write_texts();
    return 0;
  }
  keel::compat::CompareOptions co;
  co.repeat = 1;
  keel::result<keel::compat::Report> report = keel::compat::compare(o.compare, function, co);
  if (!report) return usage(report.error().to_string());
  write_texts();
  std::cout << keel::compat::to_text(report.value());
  if (!o.json.empty()) std::ofstream(o.json) << keel::compat::to_json(report.value());
  return report.value().ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "keel-generate: " << e.what() << "\n";
    return 2;
  }
}
