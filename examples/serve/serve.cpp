// keel-serve: the tiny LM (examples/tiny_lm) behind the OpenAI-compatible
// completions API, on loopback, built on keel's public API (docs/serving.md).
//
//   keel-serve --weights FILE [--port N | --port-file F] [--batching continuous|static|serial]
//              [--pages N] [--page-size N] [--max-model-len N] [--max-batch N]
//              [--token-budget N] [--max-clients N] [--threads N] [--model-name S]
//
//   POST /v1/completions  prompt (a string or token ids), max_tokens, temperature, top_p,
//                         seed, stop, stream, stream_options.include_usage
//   GET  /v1/models       the one model served
//   GET  /keel/stats      pages free and in use, running and queued requests
//
// HTTP is cpp-httplib (Debian's libcpp-httplib-dev): a thread per
// connection, which costs nothing at the 64 loopback clients this serves,
// and a chunked content provider that streams server-sent events and notices
// a client that left. The engine (engine.h) batches on a thread of its own.
// SIGINT or SIGTERM stops the server: every request ends, every page returns.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <ATen/Parallel.h>
#include <httplib.h>
#include <keel/keel.h>
#include <nlohmann/json.hpp>

#include "engine.h"

namespace {

using nlohmann::json;

struct Options {
  std::string weights, port_file, model = "tiny-lm", batching = "continuous";
  int port = 0, max_clients = 64, threads = 1;
  serve::EngineOptions engine;
};

// Error bodies as the OpenAI clients parse them (and vLLM sends them).
std::string error_body(int status, const std::string& message, const std::string& param = "") {
  const char* type = status == 404   ? "NotFoundError"
                     : status == 413 ? "RequestTooLargeError"
                     : status == 503 ? "ServiceUnavailableError"
                     : status >= 500 ? "InternalServerError"
                                     : "BadRequestError";
  json e = {{"message", message}, {"type", type}, {"code", status}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

void reply_error(httplib::Response& res, int status, const std::string& message,
                 const std::string& param = "") {
  res.status = status;
  // Tells the openai client not to retry a request that cannot succeed.
  if (status < 500) res.set_header("x-should-retry", "false");
  res.set_content(error_body(status, message, param), "application/json");
}

// A request body, checked field by field; the first problem is the answer.
struct Parsed {
  serve::Params params;
  bool stream = false, include_usage = false;
  std::string error, param;
  int status = 400;
};

Parsed parse(const std::string& body, const serve::Engine& engine, const std::string& model) {
  Parsed out;
  auto fail = [&](std::string param, std::string message, int status = 400) {
    out.param = std::move(param);
    out.error = std::move(message);
    out.status = status;
    return out;
  };
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return fail("", "the body is not valid JSON");
  if (!j.is_object()) return fail("", "the body must be a JSON object");
  if (!j.contains("model") || !j["model"].is_string()) {
    return fail("model", "model is required and must be a string");
  }
  if (j["model"] != model) {
    return fail("model",
                "the model '" + j["model"].get<std::string>() +
                    "' does not exist; this server serves '" + model + "'",
                404);
  }
  // What this server does not implement is refused by name, never ignored.
  for (const char* field : {"suffix", "best_of", "logit_bias", "user_tools"}) {
    if (j.contains(field) && !j[field].is_null()) {
      return fail(field, std::string(field) + " is not supported by this server");
    }
  }
  if (j.contains("n") && !j["n"].is_null() && j["n"] != 1) return fail("n", "n must be 1");
  if (j.contains("echo") && j["echo"].is_boolean() && j["echo"].get<bool>()) {
    return fail("echo", "echo is not supported by this server");
  }
  if (j.contains("logprobs") && !j["logprobs"].is_null()) {
    return fail("logprobs", "logprobs is not supported by this server");
  }
  // prompt: a string, one string in a list, token ids, or one list of them.
  if (!j.contains("prompt")) return fail("prompt", "prompt is required");
  json prompt = j["prompt"];
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
    prompt = prompt[0];
  }
  if (prompt.is_string()) {
    std::string why;
    auto ids = engine.encode(prompt.get<std::string>(), &why);
    if (!ids) return fail("prompt", why);
    out.params.prompt = std::move(*ids);
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
    for (const json& id : prompt) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
          id.get<std::int64_t>() >= engine.vocabulary()) {
        return fail("prompt", "prompt: token ids must be integers in [0, " +
                                  std::to_string(engine.vocabulary()) + ")");
      }
      out.params.prompt.push_back(id.get<std::int64_t>());
    }
  } else if (prompt.is_array() && prompt.size() > 1) {
    return fail("prompt", "prompt: one prompt per request (n = 1)");
  } else if (!prompt.is_array() && !prompt.is_string()) {
    return fail("prompt", "prompt must be a string, a list of token ids, or a list of one of them");
  }
  if (out.params.prompt.empty()) return fail("prompt", "prompt must not be empty");
  auto number = [&](const char* field, double lo, double hi, double* value) {
    if (!j.contains(field) || j[field].is_null()) return true;
    if (!j[field].is_number() || j[field].get<double>() < lo || j[field].get<double>() > hi) {
      return false;
    }
    *value = j[field].get<double>();
    return true;
  };
  double max_tokens = 16, temperature = 1, top_p = 1, seed = 0;
  const std::int64_t limit = engine.options().max_model_len;
  if (j.contains("max_tokens") && !j["max_tokens"].is_null() &&
      !j["max_tokens"].is_number_integer()) {
    return fail("max_tokens", "max_tokens must be an integer");
  }
  if (!number("max_tokens", 0, 1e15, &max_tokens))
    return fail("max_tokens", "max_tokens must be >= 0");
  if (!number("temperature", 0, 2, &temperature))
    return fail("temperature", "temperature must be in [0, 2]");
  if (!number("top_p", 0, 1, &top_p) || top_p <= 0) return fail("top_p", "top_p must be in (0, 1]");
  if (!number("seed", 0, 9.007199254740992e15, &seed))
    return fail("seed", "seed must be a non-negative integer");
  out.params.max_tokens = static_cast<std::int64_t>(max_tokens);
  out.params.temperature = temperature;
  out.params.top_p = top_p;
  out.params.seed = static_cast<std::uint64_t>(seed);
  const auto prompt_tokens = static_cast<std::int64_t>(out.params.prompt.size());
  if (max_tokens > static_cast<double>(limit) || prompt_tokens + out.params.max_tokens > limit) {
    // vLLM's wording: the request can never fit, whatever the load.
    return fail("max_tokens", "You passed " + std::to_string(prompt_tokens) +
                                  " input tokens and requested " +
                                  std::to_string(out.params.max_tokens) +
                                  " output tokens. However, the model's context length is only " +
                                  std::to_string(limit) + " tokens.");
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    json stop = j["stop"].is_string() ? json::array({j["stop"]}) : j["stop"];
    if (!stop.is_array() || stop.size() > 4)
      return fail("stop", "stop must be a string or up to 4 strings");
    for (const json& s : stop) {
      if (!s.is_string() || s.get<std::string>().empty()) {
        return fail("stop", "stop strings must be non-empty strings");
      }
      out.params.stop.push_back(s.get<std::string>());
    }
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return fail("stream", "stream must be a boolean");
    out.stream = j["stream"].get<bool>();
  }
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    if (!out.stream) return fail("stream_options", "stream_options is only allowed with stream");
    const json& so = j["stream_options"];
    if (!so.is_object()) return fail("stream_options", "stream_options must be an object");
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean()) {
        return fail("stream_options", "stream_options.include_usage must be a boolean");
      }
      out.include_usage = so["include_usage"].get<bool>();
    }
  }
  return out;
}

json usage(const serve::Event& e) {
  return {{"prompt_tokens", e.prompt_tokens},
          {"completion_tokens", e.completion_tokens},
          {"total_tokens", e.prompt_tokens + e.completion_tokens}};
}

// How long a provider waits for the engine before it checks the client.
constexpr std::chrono::milliseconds kPoll(50);
// A request that makes no progress for this long is abandoned (every wait is bounded).
constexpr std::chrono::seconds kStall(120);

// Streams one request as server-sent events, or collects it into one body.
// Returning false ends the response; the releaser cancels whatever is left.
class Responder {
 public:
  Responder(std::shared_ptr<serve::Request> r, Parsed p, std::string model)
      : request_(std::move(r)), parsed_(std::move(p)), model_(std::move(model)) {
    id_ = "cmpl-" + std::to_string(reinterpret_cast<std::uintptr_t>(request_.get()));
    created_ = static_cast<std::int64_t>(std::time(nullptr));
  }

  bool provide(httplib::DataSink& sink) {
    auto deadline = Clock::now() + kStall;
    for (;;) {
      std::optional<serve::Event> e = request_->next(kPoll);
      if (!e) {
        if (!sink.is_writable() || Clock::now() > deadline) return cancel();
        continue;
      }
      deadline = Clock::now() + kStall;
      // A client that left stops its request at once, not at max_tokens.
      if (!parsed_.stream && !sink.is_writable()) return cancel();
      if (parsed_.stream) {
        if (!stream_event(*e, sink)) return cancel();
      } else {
        text_ += e->text;
      }
      if (!e->final) {
        if (parsed_.stream) return true;  // called again for the next event
        continue;
      }
      if (!parsed_.stream) {
        std::string body;
        if (!e->error.empty()) {
          body = error_body(500, e->error);
        } else {
          json j = object(text_, e->finish_reason);
          j["usage"] = usage(*e);
          body = j.dump(-1, ' ', false, json::error_handler_t::replace);
        }
        if (!sink.write(body.data(), body.size())) return cancel();
      }
      done_ = true;
      sink.done();
      return true;
    }
  }

  void release(bool success) {
    if (!success || !done_) request_->cancel();
  }

 private:
  using Clock = std::chrono::steady_clock;

  json object(const std::string& text, const std::string& finish) const {
    json choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}};
    choice["finish_reason"] = finish.empty() ? json(nullptr) : json(finish);
    return {{"id", id_},
            {"object", "text_completion"},
            {"created", created_},
            {"model", model_},
            {"choices", json::array({choice})}};
  }

  static bool send(httplib::DataSink& sink, const std::string& payload) {
    const std::string frame = "data: " + payload + "\n\n";
    return sink.write(frame.data(), frame.size());
  }

  bool stream_event(const serve::Event& e, httplib::DataSink& sink) {
    if (!e.error.empty()) {
      // Mid-stream failure: an error object, then the end of the stream.
      return send(sink, error_body(500, e.error)) && send(sink, "[DONE]");
    }
    if (!e.final || !e.text.empty() || !e.finish_reason.empty()) {
      json j = object(e.text, e.final ? e.finish_reason : "");
      if (parsed_.include_usage) j["usage"] = nullptr;
      if (!send(sink, j.dump(-1, ' ', false, json::error_handler_t::replace))) return false;
    }
    if (!e.final) return true;
    if (parsed_.include_usage) {
      json u = {{"id", id_},       {"object", "text_completion"}, {"created", created_},
                {"model", model_}, {"choices", json::array()},    {"usage", usage(e)}};
      if (!send(sink, u.dump())) return false;
    }
    return send(sink, "[DONE]");
  }

  bool cancel() {
    request_->cancel();
    return false;
  }

  std::shared_ptr<serve::Request> request_;
  Parsed parsed_;
  std::string model_, id_, text_;
  std::int64_t created_ = 0;
  bool done_ = false;
};

int usage_error(const std::string& why) {
  std::cerr << "keel-serve: " << why
            << "\nusage: keel-serve --weights FILE [--port N | --port-file F] "
               "[--batching continuous|static|serial] [--pages N] [--page-size N] "
               "[--max-model-len N] [--max-batch N] [--token-budget N] [--max-clients N] "
               "[--threads N] [--model-name S]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::map<std::string, std::string*> strings = {{"--weights", &o.weights},
                                                 {"--port-file", &o.port_file},
                                                 {"--model-name", &o.model},
                                                 {"--batching", &o.batching}};
  std::map<std::string, std::int64_t*> numbers = {{"--pages", &o.engine.pages},
                                                  {"--page-size", &o.engine.page_size},
                                                  {"--max-model-len", &o.engine.max_model_len},
                                                  {"--max-batch", &o.engine.max_batch},
                                                  {"--token-budget", &o.engine.token_budget}};
  std::int64_t port = 0, max_clients = o.max_clients, threads = o.threads;
  numbers["--port"] = &port;
  numbers["--max-clients"] = &max_clients;
  numbers["--threads"] = &threads;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage_error("missing value after " + a);
    const std::string v = argv[++i];
    if (auto s = strings.find(a); s != strings.end()) {
      *s->second = v;
    } else if (auto n = numbers.find(a); n != numbers.end()) {
      char* end = nullptr;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || x < 0 || x > (1LL << 30)) {
        return usage_error("bad value for " + a);
      }
      *n->second = x;
    } else {
      return usage_error("unknown option " + a);
    }
  }
  if (o.weights.empty()) return usage_error("--weights is required");
  const std::map<std::string, serve::Batching> modes = {{"continuous", serve::Batching::continuous},
                                                        {"static", serve::Batching::static_},
                                                        {"serial", serve::Batching::serial}};
  if (modes.count(o.batching) == 0)
    return usage_error("--batching is continuous, static or serial");
  if (port > 65535 || max_clients < 1 || threads < 1)
    return usage_error("bad --port, --max-clients or --threads");
  o.engine.batching = modes.at(o.batching);
  at::set_num_threads(static_cast<int>(threads));

  // Signals go to one thread that stops the server; block them everywhere else.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::string why;
  std::optional<tiny_lm::Weights> weights = tiny_lm::load_weights(o.weights, &why);
  if (!weights) {
    std::cerr << "keel-serve: " << why << "\n";
    return 2;
  }
  std::unique_ptr<serve::Engine> engine;
  try {
    engine = std::make_unique<serve::Engine>(std::move(*weights), o.engine);
  } catch (const std::exception& e) {
    std::cerr << "keel-serve: " << e.what() << "\n";
    return 2;
  }

  httplib::Server server;
  // A worker per connection for as many clients as promised, and headroom
  // (a connection holds its worker for the whole stream).
  const auto workers = static_cast<std::size_t>(max_clients + 16);
  server.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  server.set_payload_max_length(1 << 20);
  server.set_tcp_nodelay(true);
  server.set_read_timeout(10, 0);
  server.set_write_timeout(10, 0);

  server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    Parsed p = parse(req.body, *engine, o.model);
    if (!p.error.empty()) return reply_error(res, p.status, p.error, p.param);
    int status = 500;
    std::shared_ptr<serve::Request> r = engine->submit(p.params, &why, &status);
    if (!r) return reply_error(res, status, why);
    const bool stream = p.stream;
    auto responder = std::make_shared<Responder>(std::move(r), std::move(p), o.model);
    if (stream) res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        stream ? "text/event-stream" : "application/json",
        [responder](std::size_t, httplib::DataSink& sink) { return responder->provide(sink); },
        [responder](bool success) { responder->release(success); });
  });
  server.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    const json card = {{"id", o.model},
                       {"object", "model"},
                       {"created", 0},
                       {"owned_by", "keel"},
                       {"root", o.model},
                       {"parent", nullptr},
                       {"max_model_len", o.engine.max_model_len}};
    res.set_content(json{{"object", "list"}, {"data", json::array({card})}}.dump(),
                    "application/json");
  });
  server.Get("/keel/stats", [&](const httplib::Request&, httplib::Response& res) {
    const serve::Stats s = engine->stats();
    res.set_content(json{{"pages_total", s.pages_total},
                         {"pages_free", s.pages_free},
                         {"running", s.running},
                         {"waiting", s.waiting},
                         {"steps", s.steps},
                         {"tokens_generated", s.tokens_generated},
                         {"failed_steps", s.failed_steps},
                         {"batching", o.batching},
                         {"torch", keel::build_info().torch_version},
                         {"keel", keel::version()}}
                        .dump(),
                    "application/json");
  });
  server.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.body.empty()) {
      res.set_content(error_body(res.status, res.status == 404 ? "no such route" : "bad request"),
                      "application/json");
    }
  });

  // cpp-httplib 0.11.4 listens with a backlog of 5, baked into Debian's
  // library: 32 clients connecting at once overflow it and wait for a SYN
  // retransmit (a second). Linux lets a second listen() raise it.
  int listen_fd = -1;
  server.set_socket_options([&listen_fd](int fd) {
    httplib::default_socket_options(fd);
    listen_fd = fd;
  });
  const int bound =
      port > 0
          ? (server.bind_to_port("127.0.0.1", static_cast<int>(port)) ? static_cast<int>(port) : -1)
          : server.bind_to_any_port("127.0.0.1");
  if (bound <= 0) {
    std::cerr << "keel-serve: cannot listen on 127.0.0.1:" << port << "\n";
    return 2;
  }
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
  if (!o.port_file.empty()) {
    const std::string tmp = o.port_file + ".tmp";
    std::ofstream(tmp) << bound << "\n";
    std::rename(tmp.c_str(), o.port_file.c_str());
  }
  std::printf("keel-serve: %s on http://127.0.0.1:%d (%s batching, %lld pages of %lld, torch %s)\n",
              o.model.c_str(), bound, o.batching.c_str(), static_cast<long long>(o.engine.pages),
              static_cast<long long>(o.engine.page_size), keel::build_info().torch_version.c_str());
  std::fflush(stdout);

  std::thread stopper([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    server.stop();
  });
  server.listen_after_bind();
  // The server stopped (by a signal, or on its own): the stopper is woken
  // if it still waits, then every request ends and every page returns.
  ::kill(::getpid(), SIGTERM);
  engine->stop();
  const serve::Stats s = engine->stats();
  std::printf("keel-serve: stopped after %lld steps; %lld of %lld pages free\n",
              static_cast<long long>(s.steps), static_cast<long long>(s.pages_free),
              static_cast<long long>(s.pages_total));
  if (stopper.joinable()) stopper.join();
  return s.pages_free == s.pages_total ? 0 : 1;
}
