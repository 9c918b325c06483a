// Liveness: each rank of a world publishes a heartbeat counter in the store
// (`<prefix>hb/<rank>`) from a thread of its own; a waiter asks which peers'
// counters have not moved for `peer_timeout`, by its own clock (no clocks
// are compared across machines). A rank that destroys its communicator
// writes "left", so that peers name it at once; rank 0, which hosts the
// store, then waits (at most a peer timeout) for the others to leave.
//
// Generations fence each other: once the next generation's members are
// written (reform), a rank left out of them finds the members lost ("went
// on to generation N without this rank") at its next sample, so that a
// rank that was stopped or cut off while the others re-formed fails at
// once when it resumes, instead of waiting out its operation's timeout
// beside heartbeats that still beat. A seat in a generation belongs to one
// process (`<prefix>seat/<rank>` holds its token): a rank whose seat in the
// next generation went to another process (a replacement) is fenced too.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace keel::internal::comm_detail {

struct LostPeer {
  int world_rank;
  std::string why;  // "heartbeat stopped 1.6 s ago", "left (destroyed its communicator)"
  // It destroyed its communicator: it finished its part of every operation
  // it issued, though what it sent may still be in flight.
  bool left = false;
};

// A generation's members as written in the store: "0,2,3".
std::vector<int> parse_members(const std::vector<std::uint8_t>& value);

// This process's token: the value it writes to claim a seat, unique to the
// process (its pid and a random number), the same for all its claims.
const std::string& process_token();

class Liveness {
 public:
  using Clock = std::chrono::steady_clock;

  // `store` should be a connection of its own (Store::clone()), so that a
  // long store operation elsewhere never delays the heartbeat. Writes this
  // rank's first heartbeat before it returns (before arrival), so that
  // every member's key exists once the world is formed.
  // `next_prefix` is generation `next_generation`'s prefix: its members
  // and seats are read there.
  Liveness(c10::intrusive_ptr<c10d::Store> store, std::string prefix,
           const std::string& next_prefix, int next_generation, int rank, int size,
           std::chrono::milliseconds interval, std::chrono::milliseconds peer_timeout,
           bool store_on_rank0);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Peers among `world_ranks` (this rank excluded) found lost. Samples the
  // store at most once per interval (callers share the samples). When the
  // store itself cannot be reached and rank 0 hosts it, rank 0 is lost.
  std::vector<LostPeer> lost(const std::vector<int>& world_ranks);

  std::chrono::milliseconds interval() const { return interval_; }
  std::chrono::milliseconds peer_timeout() const { return peer_timeout_; }

 private:
  void beat();
  std::string key(int rank) const;
  // The next generation's members when it was formed without this
  // process (empty otherwise); sampled with the heartbeats, under mutex_.
  std::vector<int> superseded_by();

  c10::intrusive_ptr<c10d::Store> store_;
  const std::string prefix_;
  const std::string next_members_;
  const std::string next_seat_;
  const int next_generation_;
  const int rank_;
  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds peer_timeout_;
  const bool store_on_rank0_;

  std::mutex mutex_;  // guards the samples, the store and stop_
  std::condition_variable wake_;
  bool stop_ = false;
  std::uint64_t beats_ = 0;
  struct Sample {
    std::string value;
    Clock::time_point changed;
  };
  std::vector<Sample> samples_;
  Clock::time_point sampled_{};
  std::vector<LostPeer> last_lost_;
  std::vector<int> superseded_;  // once set, it stays
  std::thread thread_;
};

}  // namespace keel::internal::comm_detail
