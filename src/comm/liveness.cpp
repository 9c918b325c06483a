#include "comm/liveness.h"

#include <unistd.h>

#include <algorithm>
#include <random>

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_split.h>

namespace keel::internal::comm_detail {
namespace {

constexpr const char* kLeft = "left";

std::vector<std::uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

}  // namespace

std::vector<int> parse_members(const std::vector<std::uint8_t>& value) {
  std::vector<int> members;
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(reinterpret_cast<const char*>(value.data()), value.size()),
                      ',', absl::SkipEmpty())) {
    int r = 0;
    if (absl::SimpleAtoi(part, &r)) members.push_back(r);
  }
  return members;
}

const std::string& process_token() {
  static const std::string token = [] {
    std::random_device random;
    const std::uint64_t nonce = (static_cast<std::uint64_t>(random()) << 32U) ^ random();
    return absl::StrCat(::getpid(), "-", absl::Hex(nonce));
  }();
  return token;
}

Liveness::Liveness(c10::intrusive_ptr<c10d::Store> store, std::string prefix,
                   const std::string& next_prefix, int next_generation, int rank, int size,
                   std::chrono::milliseconds interval, std::chrono::milliseconds peer_timeout,
                   bool store_on_rank0)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      next_members_(absl::StrCat(next_prefix, "members")),
      next_seat_(absl::StrCat(next_prefix, "seat/", rank)),
      next_generation_(next_generation),
      rank_(rank),
      interval_(interval),
      peer_timeout_(peer_timeout),
      store_on_rank0_(store_on_rank0),
      samples_(static_cast<std::size_t>(size)) {
  store_->set(key(rank_), bytes("0"));  // may throw: the caller guards
  thread_ = std::thread([this] { beat(); });
}

Liveness::~Liveness() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  try {
    store_->set(key(rank_), bytes(kLeft));
    // Rank 0 hosts the store: it lingers (at most a peer timeout) until
    // the others have left, so that they never talk to a closed store. A
    // rank that never wrote its heartbeat never arrived: there is nobody
    // to wait for (and a get of its key would block for the store's
    // timeout).
    if (rank_ == 0 && store_on_rank0_) {
      std::vector<std::string> keys;
      for (std::size_t r = 1; r < samples_.size(); ++r) keys.push_back(key(static_cast<int>(r)));
      const auto deadline = Clock::now() + peer_timeout_;
      while (!keys.empty() && Clock::now() < deadline) {
        std::vector<std::string> staying;
        for (const std::string& k : keys) {
          if (!store_->check({k})) continue;
          const auto v = store_->get(k);
          if (std::string(v.begin(), v.end()) != kLeft) staying.push_back(k);
        }
        keys = std::move(staying);
        if (!keys.empty()) std::this_thread::sleep_for(interval_);
      }
    }
  } catch (...) {  // NOLINT(bugprone-empty-catch): the store may be gone first; peers then
                   // see the heartbeat stop instead
  }
}

std::string Liveness::key(int rank) const {
  return absl::StrCat(prefix_, "hb/", rank);
}

void Liveness::beat() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, interval_, [this] { return stop_; })) {
    ++beats_;
    try {
      store_->set(key(rank_), bytes(std::to_string(beats_)));
    } catch (...) {  // NOLINT(bugprone-empty-catch): an unreachable store is what lost()
                     // reports; the heartbeat keeps trying
    }
  }
}

std::vector<int> Liveness::superseded_by() {
  if (!superseded_.empty()) return superseded_;
  if (!store_->check({next_members_})) return {};
  std::vector<int> members = parse_members(store_->get(next_members_));
  if (std::find(members.begin(), members.end(), rank_) != members.end()) {
    // This rank went on: as this process, or as a replacement that took
    // its seat while this one was stopped or cut off.
    if (!store_->check({next_seat_})) return {};
    const std::vector<std::uint8_t> seat = store_->get(next_seat_);
    if (std::string(seat.begin(), seat.end()) == process_token()) return {};
    members.erase(std::find(members.begin(), members.end(), rank_));
  }
  superseded_ = members;
  return members;
}

std::vector<LostPeer> Liveness::lost(const std::vector<int>& world_ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  if (now - sampled_ < interval_) return last_lost_;
  sampled_ = now;
  std::vector<std::string> keys;
  std::vector<int> ranks;
  for (int r : world_ranks) {
    if (r == rank_) continue;
    keys.push_back(key(r));
    ranks.push_back(r);
  }
  std::vector<LostPeer> lost;
  std::vector<std::vector<std::uint8_t>> values;
  std::vector<int> moved_on;
  try {
    moved_on = superseded_by();
    values = store_->multiGet(keys);
  } catch (const std::exception& e) {
    if (store_on_rank0_ && rank_ != 0) {
      lost.push_back({0, absl::StrCat("the store it hosts is unreachable (",
                                      std::string(e.what()).substr(0, 200), ")")});
    }
    last_lost_ = lost;
    return lost;
  }
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (std::find(moved_on.begin(), moved_on.end(), ranks[i]) != moved_on.end()) {
      lost.push_back({ranks[i], absl::StrCat("went on to generation ", next_generation_,
                                             " without this rank")});
      continue;
    }
    Sample& s = samples_[static_cast<std::size_t>(ranks[i])];
    std::string value(values[i].begin(), values[i].end());
    if (value == kLeft) {
      lost.push_back({ranks[i], "left (it destroyed its communicator)", /*left=*/true});
      continue;
    }
    if (s.changed == Clock::time_point{} || value != s.value) {
      s.value = std::move(value);
      s.changed = now;
      continue;
    }
    if (now - s.changed >= peer_timeout_) {
      const double ago = std::chrono::duration<double>(now - s.changed).count();
      lost.push_back({ranks[i], absl::StrFormat("its heartbeat stopped %.1f s ago", ago)});
    }
  }
  last_lost_ = lost;
  return lost;
}

}  // namespace keel::internal::comm_detail
