// The serving engine of examples/serve: a page allocator for the KV cache,
// a scheduler that batches requests step by step, and a Llama-family model
// (examples/models: SmolLM2 by default) whose step runs packed ragged
// queries over the paged cache (keel::attention(PackedQueries, PagedKVCache)).
// One thread (the engine's loop) owns the cache, the pages and the running
// requests; the HTTP thread only submits, cancels and reads events.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "../models/llama.h"
#include "../models/tokenizer.h"

namespace serve {

using Clock = std::chrono::steady_clock;

/// How requests share the model (docs/serving.md compares the three).
enum class Batching {
  continuous,  ///< requests join and leave between steps
  static_,     ///< a batch forms when the last one is done; finished rows are padded
  serial,      ///< one request at a time
};

/// A fixed pool of KV-cache pages with a free list. Only the engine's loop
/// allocates and frees; `free_pages()` may be read from any thread.
class PagePool {
 public:
  explicit PagePool(std::int64_t pages);
  /// n pages, or nullopt (and nothing taken) when fewer are free.
  std::optional<std::vector<std::int64_t>> allocate(std::int64_t n);
  /// Returns pages to the pool; a page that is not allocated is a bug and throws.
  void release(std::vector<std::int64_t>& pages);
  [[nodiscard]] std::int64_t total() const { return static_cast<std::int64_t>(used_.size()); }
  [[nodiscard]] std::int64_t free_pages() const { return free_count_.load(); }

 private:
  std::vector<std::int64_t> free_;
  std::vector<bool> used_;
  std::atomic<std::int64_t> free_count_{0};
};

/// What the engine tells a request's HTTP thread: text as it is generated,
/// then one final event.
struct Event {
  std::string text;
  bool final = false;
  std::string finish_reason;  // "stop" or "length" on a final event without error
  std::string error;          // set on a final event when the request failed
  std::int64_t prompt_tokens = 0, completion_tokens = 0;
};

/// What the engine serves: the model, its tokenizer and chat template, and
/// the tokens that end a text.
struct Model {
  models::Llama llama;
  models::Tokenizer tokenizer;
  std::optional<models::ChatTemplate> chat;  ///< when `chat_template.jinja` is ChatML
  std::vector<std::int64_t> stop_tokens;     ///< end of sequence, `<|im_end|>`, `<|endoftext|>`

  /// Reads a model directory as scripts/convert-gguf.py writes it
  /// (`config.json`, `model.safetensors`, `tokenizer.json`, and
  /// `chat_template.jinja` if the model has one); an error names the file.
  static keel::result<std::shared_ptr<const Model>> load(const std::string& dir,
                                                         at::ScalarType dtype);
};

/// What a client asked for, already validated.
struct Params {
  std::vector<std::int64_t> prompt;
  std::int64_t max_tokens = 16;
  double temperature = 1.0;
  double top_p = 1.0;                 ///< nucleus sampling: (0, 1]
  std::optional<std::uint64_t> seed;  ///< absent: a fresh random seed
  std::vector<std::string> stop;
  bool ignore_eos = false;  ///< generate max_tokens whatever comes (benchmarks)
};

/// One request, shared between the HTTP layer and the engine.
class Request {
 public:
  /// The next event, or nullopt if none is posted yet (the engine calls
  /// the request's notify after each post).
  std::optional<Event> poll();
  /// Asks the engine to stop this request and free its pages (between steps).
  void cancel() { cancelled_.store(true); }

 private:
  friend class Engine;
  void post(Event e);

  std::function<void()> notify_;
  Params params_;
  std::uint64_t id_ = 0;
  std::vector<std::int64_t> tokens_;  // the prompt, then what was generated
  std::vector<std::int64_t> pages_;
  std::int64_t computed_ = 0;  // tokens whose keys and values are in the cache
  std::string text_;           // generated text; sent_ of it went out
  std::size_t sent_ = 0;
  std::uint64_t rng_ = 0;
  bool finished_ = false;   // static batching: a padded row until the batch ends
  bool preempted_ = false;  // its pages were taken back once; it recomputes

  std::atomic<bool> cancelled_{false};
  std::mutex mutex_;
  std::deque<Event> events_;
};

struct EngineOptions {
  Batching batching = Batching::continuous;
  std::int64_t pages = 512;     ///< KV-cache pages (per layer, same ids)
  std::int64_t page_size = 16;  ///< keys per page
  std::int64_t max_model_len = 2048;
  std::int64_t max_batch = 64;      ///< sequences in one step
  std::int64_t token_budget = 256;  ///< tokens in one step (decodes first, then prefill chunks)
  std::int64_t max_waiting = 64;    ///< queued requests beyond which submit() refuses
  std::int64_t max_waiting_tokens = 16384;  ///< queued prompt tokens beyond which it refuses
  std::int64_t threads = 1;                 ///< the engine thread's compute threads
};

/// What /keel/stats reports.
struct Stats {
  std::int64_t pages_total = 0, pages_free = 0, running = 0, waiting = 0;
  std::int64_t steps = 0, tokens_generated = 0, failed_steps = 0;
  std::int64_t preemptions = 0;  ///< requests whose pages were taken back, to recompute later
};

class Engine {
 public:
  /// Throws std::invalid_argument when the cache cannot hold one sequence
  /// of max_model_len (so an admitted request can always run alone).
  Engine(std::shared_ptr<const Model> model, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a validated request; nullptr with `*why` when the queue is full
  /// (requests or prompt tokens), or the engine is closed or stopped (the
  /// HTTP status for it in `*status`). `notify`, if set, is called on the
  /// engine's thread, with no lock held, after each event is posted.
  std::shared_ptr<Request> submit(Params params, std::function<void()> notify, std::string* why,
                                  int* status);
  /// The model's token ids of any bytes (invalid UTF-8 as the tokenizer
  /// treats it: U+FFFD).
  [[nodiscard]] std::vector<std::int64_t> encode(const std::string& text) const {
    return model_->tokenizer.encode(text);
  }
  [[nodiscard]] std::int64_t vocabulary() const { return model_->llama.config().vocab_size; }
  [[nodiscard]] const Model& model() const { return *model_; }
  [[nodiscard]] const EngineOptions& options() const { return options_; }
  [[nodiscard]] Stats stats();
  /// Refuses new requests; running and queued ones go on (a drain).
  void close();
  /// Stops the loop; running and queued requests end with an error event.
  void stop();

 private:
  struct Row {  // one sequence's share of a step
    std::shared_ptr<Request> request;
    std::int64_t first = 0, count = 0;  // tokens_[first, first + count) go in
  };
  void loop();
  void admit();
  void grow();
  void preempt(const std::shared_ptr<Request>& r);
  std::vector<Row> schedule();
  void run_step(const std::vector<Row>& rows);
  void emit_token(Request& r, std::int64_t token);
  void finish(const std::shared_ptr<Request>& r, const std::string& reason,
              const std::string& error);
  void drop_finished();
  std::int64_t sample(Request& r, const at::Tensor& logits);

  std::shared_ptr<const Model> model_;
  EngineOptions options_;
  PagePool pool_;
  models::KVCache cache_;

  std::mutex mutex_;  // guards waiting_, stopping_ and the counters
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Request>> waiting_;
  std::int64_t waiting_tokens_ = 0;  // prompt tokens of waiting_ (as submitted)
  bool stopping_ = false, closed_ = false;
  std::uint64_t next_id_ = 1;
  std::atomic<std::int64_t> running_count_{0}, steps_{0}, generated_{0}, failed_steps_{0},
      preemptions_{0};

  std::vector<std::shared_ptr<Request>> running_;  // the loop's own
  std::thread thread_;
};

}  // namespace serve
