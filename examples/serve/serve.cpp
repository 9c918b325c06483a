// keel-serve: a Llama-family model (SmolLM2-135M-Instruct by default, as
// scripts/fetch-deps.sh converts it; examples/models) behind the
// OpenAI-compatible completions and chat completions APIs, on loopback,
// built on keel's public API (docs/serving.md).
//
//   keel-serve [--model DIR] [--dtype float32|bfloat16] [--port N | --port-file F]
//              [--batching continuous|static|serial]
//              [--pages N] [--page-size N] [--max-model-len N] [--max-batch N]
//              [--token-budget N] [--max-waiting N] [--max-waiting-tokens N]
//              [--max-connections N] [--max-body-bytes N] [--max-json-depth N]
//              [--read-timeout S] [--write-timeout S] [--drain-timeout S]
//              [--threads N] [--model-name S]
//
//   POST /v1/completions       prompt (a string or token ids), max_tokens, temperature,
//                              top_p, seed, stop, stream, stream_options.include_usage,
//                              ignore_eos
//   POST /v1/chat/completions  messages (rendered with the model's chat template), and
//                              the same fields (max_completion_tokens too)
//   GET  /v1/models       the one model served
//   GET  /health          200, or 503 while the server drains
//   GET  /keel/stats      pages free and in use, running and queued requests
//
// HTTP is Boost.Beast on one Asio thread: every connection is a state
// machine, so a slow or idle client holds a socket and a buffer, never a
// thread, and /health answers under any load. Each request's read (headers
// and body) and each write has a deadline; connections, queued requests,
// queued prompt tokens, header and body sizes and JSON nesting are bounded,
// and past a bound the answer is a status (503 with Retry-After, 413, 431,
// 400), never a queue without end. The engine (engine.h) batches on a
// thread of its own and posts each request's events to the Asio thread.
// SIGTERM or SIGINT drains: no new connection or request, running requests
// finish within --drain-timeout, then the rest end with an error event;
// every page returns and the exit status says so. A second signal exits at
// once.
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
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
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include <ATen/Parallel.h>
#include <keel/keel.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "api.h"
#include "engine.h"

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;

struct Limits {
  std::int64_t max_connections = 256;
  std::int64_t max_body_bytes = 1 << 20;
  std::int64_t max_json_depth = 64;
  std::int64_t read_timeout = 10;   ///< seconds to read one request, and to wait for the next
  std::int64_t write_timeout = 10;  ///< seconds for each write to a client
  std::int64_t drain_timeout = 30;  ///< seconds running requests have after a signal
};
constexpr std::uint32_t kHeaderLimit = 8192;  // bytes of request line and headers

struct Options {
  std::string model_dir, port_file, model, batching = "continuous", dtype = "float32";
  std::int64_t port = 0, threads = 1;
  Limits limits;
  serve::EngineOptions engine;
};

class Server;

// One client connection: read a request, answer it (a body, or a stream of
// events from the engine), and again while the client keeps it alive.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, Server& server, std::uint64_t key)
      : stream_(std::move(socket)), server_(server), key_(key) {}
  ~Connection();
  /// The server is gone (the io_context destroys what its handlers held).
  static void server_gone() { server_alive_ = false; }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void start() { read_header(); }
  /// A connection over the limit: 503 and close, without reading.
  void refuse();
  /// The server drains: a connection with no request in flight closes.
  void drain() {
    if (!busy_) close_now();
  }
  /// Called on the Asio thread after the engine posted an event.
  void pump();

 private:
  void read_header();
  void on_header(beast::error_code ec);
  void read_body();
  void handle();
  void completion(http::request<http::string_body>& req, serve::Api api);
  void reply(http::status status, std::string body, const char* type = "application/json",
             bool retry_after = false);
  void reply_error(int status, const std::string& message, const std::string& param = "");
  void after_reply(bool keep_alive);
  void watch_peer();
  void flush();
  json object(const std::string& text, const std::string& finish, bool chunk);
  std::string frame(const std::string& payload) const { return "data: " + payload + "\n\n"; }
  void close_gracefully();
  void linger();
  void close_now();

  static inline bool server_alive_ = true;
  beast::tcp_stream stream_;
  Server& server_;
  std::uint64_t key_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::string_body>> response_;
  std::optional<http::response<http::empty_body>> head_;
  std::optional<http::response_serializer<http::empty_body>> head_writer_;
  unsigned version_ = 11;
  bool keep_alive_ = false, busy_ = false, closed_ = false, writing_ = false;
  bool head_sent_ = false, ended_ = false;
  std::string pending_, out_;
  std::array<char, 512> discard_{};

  // The request in flight.
  std::shared_ptr<serve::Request> request_;
  serve::Parsed parsed_;
  std::string id_, text_;
  std::int64_t created_ = 0;
  bool first_chunk_ = true;  // a chat stream's first delta names the role
};

class Server {
 public:
  Server(net::io_context& io, serve::Engine& engine, const Options& options)
      : io_(io),
        engine_(engine),
        options_(options),
        acceptor_(io),
        drain_timer_(io),
        final_timer_(io),
        retry_timer_(io) {}

  /// Listens on 127.0.0.1; the port it bound, or 0.
  int listen(int port) {
    beast::error_code ec;
    const tcp::endpoint at(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port));
    acceptor_.open(at.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(at, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) return 0;
    accept();
    return acceptor_.local_endpoint().port();
  }

  /// Stop accepting, refuse new requests, close idle connections; running
  /// requests have the drain deadline, then the engine ends them.
  void drain() {
    if (draining_) return;
    draining_ = true;
    std::printf("keel-serve: draining (%lld s for %lld running requests)\n",
                static_cast<long long>(options_.limits.drain_timeout),
                static_cast<long long>(engine_.stats().running));
    std::fflush(stdout);
    beast::error_code ec;
    acceptor_.close(ec);
    retry_timer_.cancel();
    engine_.close();
    std::vector<std::shared_ptr<Connection>> open;
    for (auto& [key, c] : connections_) {
      if (auto p = c.lock()) open.push_back(p);
    }
    for (auto& c : open) c->drain();
    drain_timer_.expires_after(std::chrono::seconds(options_.limits.drain_timeout));
    drain_timer_.async_wait([this](beast::error_code e) {
      if (e) return;
      // The deadline: every request left ends with an error event, which
      // its connection writes; the last writes have their own deadline.
      engine_.stop();
      final_timer_.expires_after(std::chrono::seconds(options_.limits.write_timeout + 1));
      final_timer_.async_wait([this](beast::error_code f) {
        if (!f) io_.stop();
      });
    });
    finish_if_drained();
  }

  void opened(std::uint64_t key, const std::shared_ptr<Connection>& c) { connections_[key] = c; }
  void closed(std::uint64_t key) {
    connections_.erase(key);
    finish_if_drained();
  }

  [[nodiscard]] bool draining() const { return draining_; }
  [[nodiscard]] net::io_context& io() { return io_; }
  [[nodiscard]] serve::Engine& engine() { return engine_; }
  [[nodiscard]] const Options& options() const { return options_; }
  void count_refusal() { ++refused_; }

  json stats() {
    const serve::Stats s = engine_.stats();
    return {{"pages_total", s.pages_total},
            {"pages_free", s.pages_free},
            {"running", s.running},
            {"waiting", s.waiting},
            {"steps", s.steps},
            {"tokens_generated", s.tokens_generated},
            {"failed_steps", s.failed_steps},
            {"preemptions", s.preemptions},
            {"rejected", refused_},
            {"connections", connections_.size()},
            {"draining", draining_},
            {"batching", options_.batching},
            {"torch", keel::build_info().torch_version},
            {"keel", keel::version()}};
  }

 private:
  void accept() {
    acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
      if (ec) {
        // Out of descriptors, say: try again shortly rather than spin.
        retry_timer_.expires_after(std::chrono::milliseconds(100));
        retry_timer_.async_wait([this](beast::error_code e) {
          if (!e && acceptor_.is_open()) accept();
        });
        return;
      }
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      const std::uint64_t key = next_key_++;
      auto c = std::make_shared<Connection>(std::move(socket), *this, key);
      if (static_cast<std::int64_t>(connections_.size()) >= options_.limits.max_connections) {
        c->refuse();
      } else {
        opened(key, c);
        c->start();
      }
      accept();
    });
  }

  void finish_if_drained() {
    if (!draining_ || !connections_.empty()) return;
    drain_timer_.cancel();
    final_timer_.cancel();
  }

  net::io_context& io_;
  serve::Engine& engine_;
  const Options& options_;
  tcp::acceptor acceptor_;
  net::steady_timer drain_timer_, final_timer_, retry_timer_;
  std::unordered_map<std::uint64_t, std::weak_ptr<Connection>> connections_;
  std::uint64_t next_key_ = 1;
  std::int64_t refused_ = 0;
  bool draining_ = false;
};

Connection::~Connection() {
  if (request_) request_->cancel();
  try {
    if (server_alive_) server_.closed(key_);
  } catch (const std::exception& e) {  // a timer that cannot be cancelled
    std::fprintf(stderr, "keel-serve: closing a connection: %s\n", e.what());
  }
}

void Connection::refuse() {
  server_.count_refusal();
  response_.emplace(http::status::service_unavailable, 11);
  response_->set(http::field::content_type, "application/json");
  response_->set(http::field::retry_after, "1");
  response_->body() = serve::error_body(
      503, "the server has " + std::to_string(server_.options().limits.max_connections) +
               " connections open; try again");
  response_->keep_alive(false);
  response_->prepare_payload();
  stream_.expires_after(std::chrono::seconds(server_.options().limits.write_timeout));
  http::async_write(stream_, *response_,
                    [self = shared_from_this()](beast::error_code ec, std::size_t) {
                      if (ec) return self->close_now();
                      self->close_gracefully();
                    });
}

void Connection::read_header() {
  if (server_.draining()) return close_now();
  busy_ = false;
  parser_.emplace();
  parser_->header_limit(kHeaderLimit);
  parser_->body_limit(static_cast<std::uint64_t>(server_.options().limits.max_body_bytes));
  // One deadline for the whole request, headers and body, from now: a
  // client that trickles bytes is cut when it passes.
  stream_.expires_after(std::chrono::seconds(server_.options().limits.read_timeout));
  http::async_read_header(
      stream_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_header(ec); });
}

void Connection::on_header(beast::error_code ec) {
  if (ec == http::error::header_limit) {
    return reply_error(431,
                       "the request's headers exceed " + std::to_string(kHeaderLimit) + " bytes");
  }
  if (ec == http::error::body_limit) {
    return reply_error(413, "the body exceeds " +
                                std::to_string(server_.options().limits.max_body_bytes) + " bytes");
  }
  if (ec == beast::error::timeout || ec == http::error::end_of_stream ||
      ec == net::error::operation_aborted || ec == net::error::connection_reset ||
      ec == net::error::eof || closed_) {
    return close_now();
  }
  if (ec) return reply_error(400, std::string("malformed HTTP request: ") + ec.message());
  busy_ = true;
  const auto& req = parser_->get();
  version_ = req.version() == 10 ? 10 : 11;
  if (req.method() == http::verb::post) {
    const std::string type(req[http::field::content_type]);
    const std::string media = type.substr(0, type.find(';'));
    if (!beast::iequals(beast::string_view(media.data(), media.size()), "application/json")) {
      return reply_error(
          415, "the body must be JSON: Content-Type: application/json, not '" + type + "'");
    }
    if (beast::iequals(req[http::field::expect], "100-continue") && !parser_->is_done()) {
      // curl waits a second for this before it sends a body.
      out_ = version_ == 10 ? "HTTP/1.0 100 Continue\r\n\r\n" : "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(out_),
                       [self = shared_from_this()](beast::error_code e, std::size_t) {
                         if (e) return self->close_now();
                         self->read_body();
                       });
      return;
    }
  }
  read_body();
}

void Connection::read_body() {
  http::async_read(
      stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
        if (ec == http::error::body_limit) {
          return self->reply_error(
              413, "the body exceeds " +
                       std::to_string(self->server_.options().limits.max_body_bytes) + " bytes");
        }
        if (ec == beast::error::timeout || ec == http::error::end_of_stream ||
            ec == http::error::partial_message || ec == net::error::eof ||
            ec == net::error::connection_reset || self->closed_) {
          return self->close_now();
        }
        if (ec) {
          return self->reply_error(400, std::string("malformed HTTP request: ") + ec.message());
        }
        self->stream_.expires_never();
        self->handle();
      });
}

void Connection::handle() {
  http::request<http::string_body>& req = parser_->get();
  keep_alive_ = req.keep_alive();
  const std::string target(req.target().substr(0, req.target().find('?')));
  const bool get = req.method() == http::verb::get;
  auto wrong_method = [&](const char* allow) {
    reply_error(405, std::string("use ") + allow + " for " + target);
  };
  if (target == "/health") {
    if (!get) return wrong_method("GET");
    if (server_.draining())
      return reply(http::status::service_unavailable, R"({"status":"draining"})");
    return reply(http::status::ok, R"({"status":"ok"})");
  }
  if (target == "/keel/stats") {
    if (!get) return wrong_method("GET");
    return reply(http::status::ok, server_.stats().dump());
  }
  if (target == "/v1/models") {
    if (!get) return wrong_method("GET");
    const Options& o = server_.options();
    const json card = {{"id", o.model},
                       {"object", "model"},
                       {"created", 0},
                       {"owned_by", "keel"},
                       {"root", o.model},
                       {"parent", nullptr},
                       {"max_model_len", o.engine.max_model_len}};
    return reply(http::status::ok, json{{"object", "list"}, {"data", json::array({card})}}.dump());
  }
  if (target == "/v1/completions" || target == "/v1/chat/completions") {
    if (req.method() != http::verb::post) return wrong_method("POST");
    return completion(req,
                      target == "/v1/completions" ? serve::Api::completions : serve::Api::chat);
  }
  reply_error(404, "no such route: " + target);
}

void Connection::completion(http::request<http::string_body>& req, serve::Api api) {
  const Options& o = server_.options();
  parsed_ = serve::parse_request(api, req.body(), static_cast<int>(o.limits.max_json_depth),
                                 server_.engine(), o.model);
  req.body().clear();
  req.body().shrink_to_fit();
  if (!parsed_.error.empty()) return reply_error(parsed_.status, parsed_.error, parsed_.param);
  std::string why;
  int status = 500;
  std::weak_ptr<Connection> weak = weak_from_this();
  net::io_context& io = server_.io();
  request_ = server_.engine().submit(
      std::move(parsed_.params),
      [weak, &io] {
        net::post(io, [weak] {
          if (auto c = weak.lock()) c->pump();
        });
      },
      &why, &status);
  if (!request_) {
    if (status == 503) server_.count_refusal();
    return reply_error(status, why);
  }
  id_ = serve::completion_id(api);
  first_chunk_ = true;
  created_ = static_cast<std::int64_t>(std::time(nullptr));
  text_.clear();
  ended_ = head_sent_ = false;
  if (parsed_.stream) {
    // The header goes out now (chunked on HTTP/1.1; on HTTP/1.0 the body
    // ends when the connection closes); events follow as they come.
    head_.emplace(http::status::ok, version_);
    head_->set(http::field::content_type, "text/event-stream");
    head_->set(http::field::cache_control, "no-cache");
    head_->set("x-request-id", id_);
    if (version_ == 11) {
      head_->chunked(true);
      head_->keep_alive(keep_alive_ && !server_.draining());
    } else {
      keep_alive_ = false;
      head_->keep_alive(false);
    }
    head_writer_.emplace(*head_);
    writing_ = true;
    stream_.expires_after(std::chrono::seconds(o.limits.write_timeout));
    http::async_write_header(stream_, *head_writer_,
                             [self = shared_from_this()](beast::error_code ec, std::size_t) {
                               self->writing_ = false;
                               self->stream_.expires_never();
                               if (ec) return self->close_now();
                               self->head_sent_ = true;
                               self->flush();
                             });
  }
  watch_peer();
}

// A client that leaves is noticed while its request waits or generates
// (not only at the next write): the socket turns readable with nothing to
// read. Bytes of a pipelined request stop the watch; they are read later.
void Connection::watch_peer() {
  stream_.socket().async_wait(
      tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
        if (ec || self->closed_ || !self->request_) return;
        char byte = 0;
        const ssize_t n =
            ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
          self->close_now();
        } else if (n < 0) {
          self->watch_peer();
        }
      });
}

// A reply's body (chunk: a stream's frame; no text and no finish reason:
// the usage frame, with no choice).
json Connection::object(const std::string& text, const std::string& finish, bool chunk) {
  const bool chat = parsed_.api == serve::Api::chat;
  json choice = {{"index", 0}, {"logprobs", nullptr}};
  if (!chat) {
    choice["text"] = text;
  } else if (!chunk) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["delta"] = json::object();
    if (first_chunk_) choice["delta"]["role"] = "assistant";
    if (!text.empty() || first_chunk_) choice["delta"]["content"] = text;
    first_chunk_ = false;
  }
  choice["finish_reason"] = finish.empty() ? json(nullptr) : json(finish);
  return {{"id", id_},
          {"object", !chat   ? "text_completion"
                     : chunk ? "chat.completion.chunk"
                             : "chat.completion"},
          {"created", created_},
          {"model", server_.options().model},
          {"choices", json::array({choice})}};
}

void Connection::pump() {
  if (closed_) return;
  const auto dump = [](const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  while (request_) {
    std::optional<serve::Event> e = request_->poll();
    if (!e) break;
    if (!parsed_.stream) {
      text_ += e->text;
      if (!e->final) continue;
      request_.reset();
      if (!e->error.empty()) return reply_error(server_.draining() ? 503 : 500, e->error);
      json j = object(text_, e->finish_reason, false);
      j["usage"] = serve::usage(*e);
      return reply(http::status::ok, dump(j));
    }
    if (!e->error.empty()) {
      // Mid-stream failure or the drain's deadline: an error object, then
      // the end of the stream.
      pending_ += frame(serve::error_body(server_.draining() ? 503 : 500, e->error));
    } else if (!e->final || !e->text.empty() || !e->finish_reason.empty()) {
      json j = object(e->text, e->final ? e->finish_reason : "", true);
      if (parsed_.include_usage) j["usage"] = nullptr;
      pending_ += frame(dump(j));
    }
    if (e->final) {
      if (parsed_.include_usage && e->error.empty()) {
        json u = object("", "", true);
        u["choices"] = json::array();
        u["usage"] = serve::usage(*e);
        pending_ += frame(dump(u));
      }
      pending_ += frame("[DONE]");
      request_.reset();
      ended_ = true;
    }
  }
  if (parsed_.stream) flush();
}

// Writes what the stream has pending, one write at a time: events that
// come during a write go out together in the next (a slow reader gets
// fewer, larger writes, and the write deadline cuts one that stops).
void Connection::flush() {
  if (!head_sent_ || writing_ || closed_ || (pending_.empty() && !ended_)) return;
  const bool last = ended_;
  out_.clear();
  if (version_ == 11) {
    if (!pending_.empty()) {
      char size[20];
      std::snprintf(size, sizeof size, "%zx\r\n", pending_.size());
      out_ = size + pending_ + "\r\n";
    }
    if (last) out_ += "0\r\n\r\n";
  } else {
    out_ = pending_;
  }
  pending_.clear();
  writing_ = true;
  stream_.expires_after(std::chrono::seconds(server_.options().limits.write_timeout));
  net::async_write(stream_, net::buffer(out_),
                   [self = shared_from_this(), last](beast::error_code ec, std::size_t) {
                     self->writing_ = false;
                     self->stream_.expires_never();
                     if (ec) return self->close_now();
                     if (last) return self->after_reply(self->keep_alive_);
                     self->flush();
                   });
}

void Connection::reply(http::status status, std::string body, const char* type, bool retry_after) {
  response_.emplace(status, version_);
  response_->set(http::field::content_type, type);
  if (retry_after) response_->set(http::field::retry_after, "1");
  // Tells the openai client not to retry a request that cannot succeed.
  if (static_cast<int>(status) >= 400 && static_cast<int>(status) < 500) {
    response_->set("x-should-retry", "false");
  }
  if (!id_.empty()) response_->set("x-request-id", id_);
  const bool keep = keep_alive_ && !server_.draining() && static_cast<int>(status) < 400;
  response_->keep_alive(keep);
  response_->body() = std::move(body);
  response_->prepare_payload();
  stream_.expires_after(std::chrono::seconds(server_.options().limits.write_timeout));
  http::async_write(stream_, *response_,
                    [self = shared_from_this(), keep](beast::error_code ec, std::size_t) {
                      self->stream_.expires_never();
                      if (ec) return self->close_now();
                      self->after_reply(keep);
                    });
}

void Connection::reply_error(int status, const std::string& message, const std::string& param) {
  reply(static_cast<http::status>(status), serve::error_body(status, message, param),
        "application/json", status == 503);
}

void Connection::after_reply(bool keep_alive) {
  request_.reset();
  id_.clear();
  pending_.clear();
  head_sent_ = ended_ = false;
  if (keep_alive && !server_.draining() && !closed_) return read_header();
  close_gracefully();
}

// Closing after the last reply: stop sending, then read (and drop) what
// the client still sends for at most a second, so that the kernel does not
// reset the connection before the client has read the reply.
void Connection::close_gracefully() {
  if (closed_) return;
  busy_ = true;
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream_.expires_after(std::chrono::seconds(1));
  linger();
}

void Connection::linger() {
  stream_.async_read_some(net::buffer(discard_),
                          [self = shared_from_this()](beast::error_code ec, std::size_t) {
                            if (ec) return self->close_now();
                            self->linger();
                          });
}

void Connection::close_now() {
  if (closed_) return;
  closed_ = true;
  if (request_) {
    request_->cancel();
    request_.reset();
  }
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.close();
}

int usage_error(const std::string& why) {
  std::cerr
      << "keel-serve: " << why
      << "\nusage: keel-serve [--model DIR] [--dtype float32|bfloat16] [--port N | --port-file F] "
         "[--batching continuous|static|serial] [--pages N] [--page-size N] "
         "[--max-model-len N] [--max-batch N] [--token-budget N] [--max-waiting N] "
         "[--max-waiting-tokens N] [--max-connections N] [--max-body-bytes N] "
         "[--max-json-depth N] [--read-timeout S] [--write-timeout S] "
         "[--drain-timeout S] [--threads N] [--model-name S]\n";
  return 2;
}

// Signals: blocked in every thread from the first line of main, and taken
// by one thread with sigwait, so none is lost, start-up included.
struct Signals {
  std::mutex mutex;
  Server* server = nullptr;  // set once the server listens
  net::io_context* io = nullptr;
  int count = 0;
};

void wait_for_signals(const sigset_t& set, Signals& state) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    std::lock_guard<std::mutex> lock(state.mutex);
    if (++state.count > 1) {
      std::fprintf(stderr, "keel-serve: second signal (%d): exiting now\n", sig);
      std::_Exit(128 + sig);
    }
    if (state.server == nullptr) {
      // Nothing was served yet: nothing to drain.
      std::printf("keel-serve: signal %d during start-up: stopped\n", sig);
      std::fflush(stdout);
      std::_Exit(0);
    }
    Server* server = state.server;
    net::post(*state.io, [server] { server->drain(); });
  }
}

int run(int argc, char** argv) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  static Signals state;
  std::thread(wait_for_signals, signals, std::ref(state)).detach();
  // A client that leaves makes writes fail, not the process.
  std::signal(SIGPIPE, SIG_IGN);

  Options o;
  o.model_dir = models::default_model_dir();
  std::map<std::string, std::string*> strings = {{"--model", &o.model_dir},
                                                 {"--dtype", &o.dtype},
                                                 {"--port-file", &o.port_file},
                                                 {"--model-name", &o.model},
                                                 {"--batching", &o.batching}};
  std::map<std::string, std::int64_t*> numbers = {
      {"--pages", &o.engine.pages},
      {"--page-size", &o.engine.page_size},
      {"--max-model-len", &o.engine.max_model_len},
      {"--max-batch", &o.engine.max_batch},
      {"--token-budget", &o.engine.token_budget},
      {"--max-waiting", &o.engine.max_waiting},
      {"--max-waiting-tokens", &o.engine.max_waiting_tokens},
      {"--max-connections", &o.limits.max_connections},
      {"--max-body-bytes", &o.limits.max_body_bytes},
      {"--max-json-depth", &o.limits.max_json_depth},
      {"--read-timeout", &o.limits.read_timeout},
      {"--write-timeout", &o.limits.write_timeout},
      {"--drain-timeout", &o.limits.drain_timeout},
      {"--port", &o.port},
      {"--threads", &o.threads}};
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
  if (o.dtype != "float32" && o.dtype != "bfloat16") {
    return usage_error("--dtype is float32 or bfloat16");
  }
  const std::map<std::string, serve::Batching> modes = {{"continuous", serve::Batching::continuous},
                                                        {"static", serve::Batching::static_},
                                                        {"serial", serve::Batching::serial}};
  if (modes.count(o.batching) == 0)
    return usage_error("--batching is continuous, static or serial");
  const Limits& l = o.limits;
  if (o.port > 65535 || o.threads < 1 || l.max_connections < 1 || l.max_json_depth < 2 ||
      l.read_timeout < 1 || l.write_timeout < 1 || o.engine.max_waiting < 1) {
    return usage_error(
        "bad --port, --threads, --max-connections, --max-json-depth, --max-waiting or timeout");
  }
  o.engine.batching = modes.at(o.batching);
  // Loading runs on one thread: the engine's thread owns the only OpenMP
  // team, of --threads (engine.cpp, Engine::loop).
  at::set_num_threads(1);
  o.engine.threads = o.threads;

  if (o.model.empty()) {
    const std::string dir = o.model_dir.substr(0, o.model_dir.find_last_not_of('/') + 1);
    o.model = dir.substr(dir.find_last_of('/') + 1);
  }
  keel::result<std::shared_ptr<const serve::Model>> model =
      serve::Model::load(o.model_dir, o.dtype == "bfloat16" ? at::kBFloat16 : at::kFloat);
  if (!model) {
    std::cerr << "keel-serve: " << model.error().to_string() << "\n";
    return 2;
  }
  std::unique_ptr<serve::Engine> engine;
  try {
    engine = std::make_unique<serve::Engine>(model.value(), o.engine);
  } catch (const std::exception& e) {
    std::cerr << "keel-serve: " << e.what() << "\n";
    return 2;
  }

  {
    net::io_context io(1);
    Server server(io, *engine, o);
    const int bound = server.listen(static_cast<int>(o.port));
    if (bound <= 0) {
      std::cerr << "keel-serve: cannot listen on 127.0.0.1:" << o.port << "\n";
      return 2;
    }
    {
      std::lock_guard<std::mutex> lock(state.mutex);
      state.io = &io;
      state.server = &server;
    }
    if (!o.port_file.empty()) {
      const std::string tmp = o.port_file + ".tmp";
      std::ofstream(tmp) << bound << "\n";
      std::rename(tmp.c_str(), o.port_file.c_str());
    }
    std::printf(
        "keel-serve: %s on http://127.0.0.1:%d (%s batching, %lld pages of %lld, torch %s)\n",
        o.model.c_str(), bound, o.batching.c_str(), static_cast<long long>(o.engine.pages),
        static_cast<long long>(o.engine.page_size), keel::build_info().torch_version.c_str());
    std::fflush(stdout);
    io.run();
    {
      // Drained (or past the last deadline); a signal from now on exits at once.
      std::lock_guard<std::mutex> lock(state.mutex);
      state.count = 1;
      state.server = nullptr;
    }
    // Every request ends and every page returns before the io_context, to
    // which the engine posts, goes; the connections it still holds go with it.
    engine->stop();
    Connection::server_gone();
  }
  const serve::Stats s = engine->stats();
  std::printf("keel-serve: stopped after %lld steps; %lld of %lld pages free\n",
              static_cast<long long>(s.steps), static_cast<long long>(s.pages_free),
              static_cast<long long>(s.pages_total));
  std::fflush(stdout);
  return s.pages_free == s.pages_total ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel-serve: %s\n", e.what());
    return 2;
  }
}
