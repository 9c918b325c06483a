#include "engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <utility>

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <keel/keel.h>

namespace serve {

// --- the page allocator -------------------------------------------------------

PagePool::PagePool(std::int64_t pages) : used_(static_cast<std::size_t>(pages), false) {
  free_.reserve(used_.size());
  for (std::int64_t p = pages - 1; p >= 0; --p) free_.push_back(p);
  free_count_.store(pages);
}

std::optional<std::vector<std::int64_t>> PagePool::allocate(std::int64_t n) {
  if (n > static_cast<std::int64_t>(free_.size())) return std::nullopt;
  std::vector<std::int64_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - static_cast<std::size_t>(n));
  for (std::int64_t p : out) used_[static_cast<std::size_t>(p)] = true;
  free_count_.store(static_cast<std::int64_t>(free_.size()));
  return out;
}

void PagePool::release(std::vector<std::int64_t>& pages) {
  for (std::int64_t p : pages) {
    if (p < 0 || p >= total() || !used_[static_cast<std::size_t>(p)]) {
      throw std::logic_error("page " + std::to_string(p) + " released but not allocated");
    }
    used_[static_cast<std::size_t>(p)] = false;
    free_.push_back(p);
  }
  pages.clear();
  free_count_.store(static_cast<std::int64_t>(free_.size()));
}

// --- a request ----------------------------------------------------------------

std::optional<Event> Request::poll() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (events_.empty()) return std::nullopt;
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void Request::post(Event e) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(e));
  }
  if (notify_) notify_();
}

// --- the engine ---------------------------------------------------------------

namespace {

std::int64_t pages_for(std::int64_t tokens, std::int64_t page_size) {
  return (tokens + page_size - 1) / page_size;
}

double uniform(std::uint64_t& state) {  // SplitMix64, in [0, 1)
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30U)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27U)) * 0x94D049BB133111EBULL;
  return static_cast<double>((z ^ (z >> 31U)) >> 11U) * 0x1.0p-53;
}

// The end of text[from, end) cut back to a character boundary: a token may
// end inside a character, whose rest comes with the next token. Bytes that
// cannot start a character (invalid UTF-8) are not held.
std::size_t utf8_whole(const std::string& text, std::size_t from, std::size_t end) {
  for (std::size_t back = 1; back <= 3 && end >= from + back; ++back) {
    const auto byte = static_cast<unsigned char>(text[end - back]);
    if ((byte & 0xC0U) == 0x80U) continue;  // a continuation byte: look further back
    const std::size_t length = byte >= 0xF0U ? 4 : byte >= 0xE0U ? 3 : byte >= 0xC0U ? 2 : 1;
    return length > back ? end - back : end;
  }
  return end;
}

}  // namespace

keel::result<std::shared_ptr<const Model>> Model::load(const std::string& dir,
                                                       at::ScalarType dtype) {
  keel::result<models::Llama> llama = models::Llama::load(dir, dtype);
  if (!llama) return llama.error();
  keel::result<models::Tokenizer> tokenizer = models::Tokenizer::load(dir + "/tokenizer.json");
  if (!tokenizer) return tokenizer.error();
  auto model = std::make_shared<Model>(
      Model{std::move(llama).value(), std::move(tokenizer).value(), std::nullopt, {}});
  std::ifstream jinja_file(dir + "/chat_template.jinja");
  if (jinja_file) {
    const std::string jinja((std::istreambuf_iterator<char>(jinja_file)),
                            std::istreambuf_iterator<char>());
    keel::result<models::ChatTemplate> chat = models::ChatTemplate::from_jinja(jinja);
    if (!chat) return chat.error();
    model->chat = std::move(chat).value();
  }
  model->stop_tokens = models::stop_tokens(model->tokenizer, model->llama.config().eos_token_id);
  return std::shared_ptr<const Model>(std::move(model));
}

Engine::Engine(std::shared_ptr<const Model> model, EngineOptions options)
    : model_(std::move(model)), options_(options), pool_(options.pages) {
  const EngineOptions& o = options_;
  if (o.page_size < 1 || o.max_model_len < 2 || o.max_batch < 1 || o.token_budget < o.max_batch) {
    throw std::invalid_argument(
        "page_size >= 1, max_model_len >= 2 and token_budget >= max_batch >= 1 are required");
  }
  if (o.pages * o.page_size < o.max_model_len) {
    throw std::invalid_argument(
        "the cache (" + std::to_string(o.pages) + " pages of " + std::to_string(o.page_size) +
        " keys) cannot hold one sequence of max_model_len " + std::to_string(o.max_model_len));
  }
  const std::int64_t positions = model_->llama.config().max_positions;
  if (positions > 0 && o.max_model_len > positions) {
    throw std::invalid_argument("max_model_len " + std::to_string(o.max_model_len) +
                                " is past the model's " + std::to_string(positions) + " positions");
  }
  cache_ = model_->llama.make_cache(o.pages, o.page_size);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  stop();
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<Request> Engine::submit(Params params, std::function<void()> notify,
                                        std::string* why, int* status) {
  auto r = std::make_shared<Request>();
  r->notify_ = std::move(notify);
  // An unseeded request draws its seed; a seeded one (0 included) repeats.
  r->rng_ = params.seed ? *params.seed : std::random_device{}() * 0x100000001ULL;
  const auto prompt = static_cast<std::int64_t>(params.prompt.size());
  std::lock_guard<std::mutex> lock(mutex_);
  *status = 503;
  if (stopping_ || closed_) {
    *why = "the server is shutting down";
    return nullptr;
  }
  if (static_cast<std::int64_t>(waiting_.size()) >= options_.max_waiting) {
    *why = "the server has " + std::to_string(waiting_.size()) + " requests queued; try again";
    return nullptr;
  }
  if (waiting_tokens_ + prompt > options_.max_waiting_tokens && !waiting_.empty()) {
    *why = "the server has " + std::to_string(waiting_tokens_) + " prompt tokens queued; try again";
    return nullptr;
  }
  r->id_ = next_id_++;
  r->tokens_ = params.prompt;
  r->params_ = std::move(params);
  waiting_.push_back(r);
  waiting_tokens_ += prompt;
  wake_.notify_all();
  return r;
}

void Engine::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
}

Stats Engine::stats() {
  Stats s;
  s.pages_total = pool_.total();
  s.pages_free = pool_.free_pages();
  s.running = running_count_.load();
  s.steps = steps_.load();
  s.tokens_generated = generated_.load();
  s.failed_steps = failed_steps_.load();
  s.preemptions = preemptions_.load();
  std::lock_guard<std::mutex> lock(mutex_);
  s.waiting = static_cast<std::int64_t>(waiting_.size());
  return s;
}

void Engine::loop() {
  c10::NoGradGuard no_grad;
  // The compute threads are this thread's: OpenMP keeps a team per thread
  // that starts parallel work, and a second team (the loader's, say) makes
  // libgomp see more threads than cores and put every worker to sleep
  // between regions (a futex wake each: a decode step took 45 ms instead
  // of 25 on 2 cores).
  at::set_num_threads(static_cast<int>(options_.threads));
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Bounded: the loop also wakes to apply cancellations of queued requests.
      wake_.wait_for(lock, std::chrono::milliseconds(50),
                     [&] { return stopping_ || !waiting_.empty() || !running_.empty(); });
      if (stopping_) break;
    }
    for (const auto& r : running_) {
      if (r->cancelled_.load()) finish(r, "", "cancelled");
    }
    drop_finished();
    admit();
    const std::vector<Row> rows = schedule();
    if (!rows.empty()) {
      try {
        run_step(rows);
        steps_.fetch_add(1);
      } catch (const std::exception& e) {
        // A step that fails ends its requests with the reason; the server
        // and every other request go on.
        failed_steps_.fetch_add(1);
        for (const Row& row : rows)
          finish(row.request, "", std::string("step failed: ") + e.what());
      }
    }
    drop_finished();
  }
  for (const auto& r : running_) finish(r, "", "the server is shutting down");
  for (auto& r : running_) pool_.release(r->pages_);
  running_.clear();
  running_count_.store(0);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& r : waiting_) finish(r, "", "the server is shutting down");
  waiting_.clear();
  waiting_tokens_ = 0;
}

void Engine::admit() {
  const std::int64_t limit = options_.batching == Batching::serial ? 1 : options_.max_batch;
  if (options_.batching == Batching::static_ && !running_.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  while (!waiting_.empty() && static_cast<std::int64_t>(running_.size()) < limit) {
    const std::shared_ptr<Request> r = waiting_.front();
    const auto prompt = static_cast<std::int64_t>(r->params_.prompt.size());
    if (r->cancelled_.load() || r->params_.max_tokens == 0) {
      waiting_.pop_front();
      if (!r->preempted_) waiting_tokens_ -= prompt;
      finish(r, "length", r->cancelled_.load() ? "cancelled" : "");
      continue;
    }
    // Admission takes the pages of what is to be computed now (the prompt,
    // or a preempted request's prompt and output); the pages of later
    // tokens are taken as they come (grow), and preemption gives them back.
    std::optional<std::vector<std::int64_t>> pages =
        pool_.allocate(pages_for(static_cast<std::int64_t>(r->tokens_.size()), options_.page_size));
    if (!pages) break;
    r->pages_ = std::move(*pages);
    waiting_.pop_front();
    if (!r->preempted_) waiting_tokens_ -= prompt;
    running_.push_back(r);
    // Counted as it is admitted: a client that has its first token (sent
    // during the step that follows) sees the request among the running.
    running_count_.store(static_cast<std::int64_t>(running_.size()));
  }
}

void Engine::preempt(const std::shared_ptr<Request>& r) {
  // Recompute, as vLLM V1: the pages go back; the request waits at the
  // head of the queue with its tokens, and computes them again when it is
  // admitted. What it already sent stays sent.
  pool_.release(r->pages_);
  r->computed_ = 0;
  r->preempted_ = true;
  preemptions_.fetch_add(1);
  running_.erase(std::find(running_.begin(), running_.end(), r));
  std::lock_guard<std::mutex> lock(mutex_);
  waiting_.push_front(r);
}

void Engine::grow() {
  // Each running request gets the pages its next step writes, oldest first;
  // when none is free the newest still running is preempted, this one
  // included. The pool holds one sequence of max_model_len, so the oldest
  // can always grow: no deadlock.
  // By index: preemption erases from running_ as the loop goes.
  for (std::size_t i = 0; i < running_.size(); ++i) {  // NOLINT(modernize-loop-convert)
    const std::shared_ptr<Request> r = running_[i];
    if (r->finished_) continue;
    const std::int64_t need =
        pages_for(static_cast<std::int64_t>(r->tokens_.size()), options_.page_size) -
        static_cast<std::int64_t>(r->pages_.size());
    if (need <= 0) continue;
    bool preempted = false;
    while (pool_.free_pages() < need && !preempted) {
      // A finished row of a static batch keeps its pages until the batch
      // ends; r itself still runs, so the search stops at i.
      std::size_t v = running_.size() - 1;
      while (running_[v]->finished_) --v;
      if (v == 0) break;  // r alone: the pool is smaller than one sequence
      preempted = running_[v] == r;
      preempt(running_[v]);
    }
    if (preempted) break;  // r and everything after it wait
    std::optional<std::vector<std::int64_t>> pages = pool_.allocate(need);
    if (!pages) {
      finish(r, "", "the KV cache cannot hold this request");
      continue;
    }
    r->pages_.insert(r->pages_.end(), pages->begin(), pages->end());
  }
  running_count_.store(static_cast<std::int64_t>(running_.size()));
}

std::vector<Engine::Row> Engine::schedule() {
  grow();
  std::vector<Row> rows;
  std::int64_t budget = options_.token_budget;
  // Decodes first (one token each, or a padded row of a static batch), then
  // prefill chunks in admission order with what is left of the budget.
  for (const auto& r : running_) {
    const auto n = static_cast<std::int64_t>(r->tokens_.size());
    if (r->finished_) {
      // A padded row recomputes its last computed position (its page is
      // held; its keys come out the same), as a [B, L] batch would.
      if (r->computed_ > 0) {
        rows.push_back({r, r->computed_ - 1, 1});
        --budget;
      }
    } else if (n - r->computed_ == 1) {
      rows.push_back({r, r->computed_, 1});
      --budget;
    }
  }
  for (const auto& r : running_) {
    const auto n = static_cast<std::int64_t>(r->tokens_.size());
    if (r->finished_ || n - r->computed_ <= 1) continue;
    const std::int64_t chunk = std::min(n - r->computed_, budget);
    if (chunk <= 0) break;
    rows.push_back({r, r->computed_, chunk});
    budget -= chunk;
  }
  return rows;
}

void Engine::run_step(const std::vector<Row>& rows) {
  std::vector<models::StepSequence> sequences;
  sequences.reserve(rows.size());
  for (const Row& row : rows) {
    const Request& r = *row.request;
    const auto first = r.tokens_.begin() + row.first;
    sequences.push_back({std::vector<std::int64_t>(first, first + row.count), row.first, r.pages_});
  }
  keel::result<at::Tensor> hidden = model_->llama.step(sequences, cache_);
  if (!hidden) throw std::runtime_error(hidden.error().to_string());

  // Rows that reached their sequence's end sample its next token.
  std::vector<std::int64_t> last;
  std::vector<const Row*> sampled;
  std::int64_t end = 0;
  for (const Row& row : rows) {
    end += row.count;
    Request& r = *row.request;
    if (r.finished_) continue;
    r.computed_ = row.first + row.count;
    if (r.computed_ == static_cast<std::int64_t>(r.tokens_.size())) {
      last.push_back(end - 1);
      sampled.push_back(&row);
    }
  }
  if (last.empty()) return;
  const at::Tensor logits =
      model_->llama.logits(hidden.value().index_select(0, at::tensor(last))).contiguous();
  for (std::size_t j = 0; j < sampled.size(); ++j) {
    Request& r = *sampled[j]->request;
    emit_token(r, sample(r, logits[static_cast<std::int64_t>(j)]));
  }
}

std::int64_t Engine::sample(Request& r, const at::Tensor& logits) {
  if (r.params_.temperature == 0) return logits.argmax().item<std::int64_t>();
  const at::Tensor p = at::softmax(logits.to(at::kDouble) / r.params_.temperature, 0);
  if (r.params_.top_p >= 1) {
    // Every token: the first whose cumulative mass passes the draw.
    const double* q = p.data_ptr<double>();
    const double u = uniform(r.rng_);
    double acc = 0;
    for (std::int64_t i = 0; i < p.numel(); ++i) {
      acc += q[i];
      if (u < acc) return i;
    }
    return p.numel() - 1;
  }
  // Nucleus sampling: the most probable tokens whose mass reaches top_p,
  // renormalised, drawn with the request's seed.
  const auto [probs, order] = p.sort(0, true);
  const double* q = probs.data_ptr<double>();
  const std::int64_t* id = order.data_ptr<std::int64_t>();
  std::int64_t keep = 0;
  double mass = 0;
  while (keep < probs.numel() && (keep == 0 || mass < r.params_.top_p)) mass += q[keep++];
  const double u = uniform(r.rng_) * mass;
  double acc = 0;
  for (std::int64_t i = 0; i < keep; ++i) {
    acc += q[i];
    if (u < acc) return id[i];
  }
  return id[keep - 1];
}

void Engine::emit_token(Request& r, std::int64_t token) {
  r.tokens_.push_back(token);
  generated_.fetch_add(1);
  const Model& m = *model_;
  const bool eos = !r.params_.ignore_eos && std::find(m.stop_tokens.begin(), m.stop_tokens.end(),
                                                      token) != m.stop_tokens.end();
  // Special tokens have no text (vLLM's skip_special_tokens).
  if (!eos && !m.tokenizer.is_special(token)) r.text_ += m.tokenizer.decode({token}).value();
  const auto generated = static_cast<std::int64_t>(r.tokens_.size() - r.params_.prompt.size());
  // A stop string ends the text before it; a tail that could still become
  // one is held back until it cannot.
  std::size_t end = r.text_.size(), hold = 0;
  std::string reason;
  for (const std::string& stop : r.params_.stop) {
    if (stop.empty()) continue;
    // Text before sent_ held no prefix of a stop string when it went out.
    const std::size_t at = r.text_.find(stop, r.sent_);
    if (at != std::string::npos && at < end) {
      end = at;
      reason = "stop";
    }
    for (std::size_t k = std::min(stop.size() - 1, r.text_.size() - r.sent_); k > hold; --k) {
      if (r.text_.compare(r.text_.size() - k, k, stop, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  if (reason.empty() && eos) reason = "stop";
  if (reason.empty() && generated >= r.params_.max_tokens) reason = "length";
  if (reason.empty()) end = utf8_whole(r.text_, r.sent_, r.text_.size() - hold);
  if (end > r.sent_) {
    Event ev;
    ev.text = r.text_.substr(r.sent_, end - r.sent_);
    r.sent_ = end;
    r.post(std::move(ev));
  }
  if (!reason.empty()) {
    Event ev;
    ev.final = true;
    ev.finish_reason = reason;
    ev.prompt_tokens = static_cast<std::int64_t>(r.params_.prompt.size());
    ev.completion_tokens = generated;
    r.post(std::move(ev));
    r.finished_ = true;
  }
}

void Engine::finish(const std::shared_ptr<Request>& r, const std::string& reason,
                    const std::string& error) {
  // Ends a request that has not ended: its final event (with the error when
  // it failed). Its pages go back in drop_finished.
  if (r->finished_) return;
  Event ev;
  ev.final = true;
  ev.finish_reason = reason;
  ev.error = error;
  ev.prompt_tokens = static_cast<std::int64_t>(r->params_.prompt.size());
  ev.completion_tokens = static_cast<std::int64_t>(r->tokens_.size() - r->params_.prompt.size());
  r->post(std::move(ev));
  r->finished_ = true;
}

void Engine::drop_finished() {
  if (options_.batching == Batching::static_) {
    // A static batch holds its rows (and their pages) until every row is done.
    const bool all =
        std::all_of(running_.begin(), running_.end(), [](const auto& r) { return r->finished_; });
    if (!all) return;
  }
  for (auto& r : running_) {
    if (r->finished_) pool_.release(r->pages_);
  }
  running_.erase(
      std::remove_if(running_.begin(), running_.end(), [](const auto& r) { return r->finished_; }),
      running_.end());
  // After the pages went back: a request leaves the count once its pages
  // are free, so "none running" always means "every page free".
  running_count_.store(static_cast<std::int64_t>(running_.size()));
}

}  // namespace serve
