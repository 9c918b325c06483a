#include "engine.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <utility>

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

std::optional<Event> Request::next(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, wait, [&] { return !events_.empty(); })) return std::nullopt;
  Event e = std::move(events_.front());
  events_.pop_front();
  return e;
}

void Request::post(Event e) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
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

}  // namespace

Engine::Engine(tiny_lm::Weights weights, EngineOptions options)
    : weights_(std::move(weights)), options_(options), pool_(options.pages) {
  id_of_.fill(-1);
  for (std::size_t i = 0; i < weights_.byte_of.size(); ++i) {
    id_of_[weights_.byte_of[i]] = static_cast<std::int64_t>(i);
  }
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
  const tiny_lm::Shape& s = weights_.shape;
  for (std::int64_t l = 0; l < s.layers; ++l) {
    k_pages_.push_back(at::zeros({o.pages, s.kv_heads, o.page_size, s.head_dim()}));
    v_pages_.push_back(at::zeros({o.pages, s.kv_heads, o.page_size, s.head_dim()}));
  }
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

std::optional<std::vector<std::int64_t>> Engine::encode(const std::string& text,
                                                        std::string* why) const {
  std::vector<std::int64_t> ids;
  ids.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto ch = static_cast<unsigned char>(text[i]);
    if (id_of_[ch] < 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", ch);
      *why = "prompt: byte " + std::to_string(i) + " (" + hex +
             ") is not in the model's vocabulary of " + std::to_string(vocabulary()) +
             " characters";
      return std::nullopt;
    }
    ids.push_back(id_of_[ch]);
  }
  return ids;
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
      rows.push_back({r, n - 1, 1});
      --budget;
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
  const tiny_lm::Shape& s = weights_.shape;
  const tiny_lm::Params& p = weights_.params;
  const std::int64_t ps = options_.page_size, e = s.head_dim();
  const auto b = static_cast<std::int64_t>(rows.size());
  std::int64_t t = 0, max_pages = 1;
  for (const Row& row : rows) {
    t += row.count;
    max_pages = std::max(max_pages, static_cast<std::int64_t>(row.request->pages_.size()));
  }
  std::vector<std::int64_t> tokens, positions, slot_page, slot_off, cu{0}, lengths;
  std::vector<std::int64_t> table(static_cast<std::size_t>(b * max_pages), 0);
  for (std::int64_t i = 0; i < b; ++i) {
    const Row& row = rows[static_cast<std::size_t>(i)];
    const Request& r = *row.request;
    for (std::int64_t pos = row.first; pos < row.first + row.count; ++pos) {
      tokens.push_back(r.tokens_[static_cast<std::size_t>(pos)]);
      positions.push_back(pos);
      slot_page.push_back(r.pages_[static_cast<std::size_t>(pos / ps)]);
      slot_off.push_back(pos % ps);
    }
    std::copy(r.pages_.begin(), r.pages_.end(), table.begin() + i * max_pages);
    cu.push_back(cu.back() + row.count);
    lengths.push_back(row.first + row.count);
  }
  const at::Tensor page_table = at::tensor(table).view({b, max_pages});
  const at::Tensor cu_t = at::tensor(cu), lengths_t = at::tensor(lengths);
  const at::Tensor page_idx = at::tensor(slot_page), off_idx = at::tensor(slot_off);
  auto [cos, sin] = tiny_lm::rope_angles(at::tensor(positions).to(at::kFloat), e);
  cos = cos.unsqueeze(1);
  sin = sin.unsqueeze(1);

  keel::AttentionSpec spec;
  spec.masks = {keel::Mask::sliding_window(s.window - 1, 0, keel::CausalAlignment::bottom_right)};
  at::Tensor x = p.at("embed").index_select(0, at::tensor(tokens));
  using at::indexing::Slice;
  for (std::int64_t l = 0; l < s.layers; ++l) {
    const at::Tensor h = tiny_lm::rms_norm(x, p.at(tiny_lm::layer_name(l, "norm1")));
    auto project = [&](const char* w, std::int64_t heads) {
      return at::matmul(h, p.at(tiny_lm::layer_name(l, w))).view({t, heads, e});
    };
    const at::Tensor q = tiny_lm::rotate(project("wq", s.q_heads), cos, sin);
    const auto li = static_cast<std::size_t>(l);
    // This step's keys and values go into their pages first: each
    // sequence's queries then read its whole cache, its new keys included.
    k_pages_[li].index_put_({page_idx, Slice(), off_idx},
                            tiny_lm::rotate(project("wk", s.kv_heads), cos, sin));
    v_pages_[li].index_put_({page_idx, Slice(), off_idx}, project("wv", s.kv_heads));
    keel::result<keel::AttentionOutput> a = keel::attention(
        keel::PackedQueries{q, cu_t},
        keel::PagedKVCache{k_pages_[li], v_pages_[li], page_table, lengths_t}, spec);
    if (!a) throw std::runtime_error(a.error().to_string());
    x = x +
        at::matmul(a.value().out.reshape({t, s.q_heads * e}), p.at(tiny_lm::layer_name(l, "wo")));
    const at::Tensor h2 = tiny_lm::rms_norm(x, p.at(tiny_lm::layer_name(l, "norm2")));
    x = x + at::matmul(at::gelu(at::matmul(h2, p.at(tiny_lm::layer_name(l, "w1")))),
                       p.at(tiny_lm::layer_name(l, "w2")));
  }
  const at::Tensor hidden = tiny_lm::rms_norm(x, p.at("norm_final"));

  // Rows that reached their sequence's end sample its next token.
  std::vector<std::int64_t> last;
  std::vector<const Row*> sampled;
  for (std::int64_t i = 0; i < b; ++i) {
    const Row& row = rows[static_cast<std::size_t>(i)];
    Request& r = *row.request;
    if (r.finished_) continue;
    r.computed_ = row.first + row.count;
    if (r.computed_ == static_cast<std::int64_t>(r.tokens_.size())) {
      last.push_back(cu[static_cast<std::size_t>(i) + 1] - 1);
      sampled.push_back(&row);
    }
  }
  if (last.empty()) return;
  const at::Tensor logits =
      at::matmul(hidden.index_select(0, at::tensor(last)), p.at("embed").t()).contiguous();
  for (std::size_t j = 0; j < sampled.size(); ++j) {
    Request& r = *sampled[j]->request;
    emit_token(r, sample(r, logits[static_cast<std::int64_t>(j)]));
  }
}

std::int64_t Engine::sample(Request& r, const at::Tensor& logits) {
  if (r.params_.temperature == 0) return logits.argmax().item<std::int64_t>();
  // Nucleus sampling: the most probable tokens whose mass reaches top_p
  // (top_p = 1: every token), renormalised, drawn with the request's seed.
  const auto [probs, order] =
      at::softmax(logits.to(at::kDouble) / r.params_.temperature, 0).sort(0, true);
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
  r.text_ += static_cast<char>(weights_.byte_of[static_cast<std::size_t>(token)]);
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
  if (reason.empty() && generated >= r.params_.max_tokens) reason = "length";
  if (reason.empty()) end = r.text_.size() - hold;
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
