// A communicator's flight recorder: the last N operations, as c10d's
// FlightRecorder keeps them for NCCL (its template is header-only and
// NCCL-shaped, so keel keeps its own, for every backend).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace keel::internal::comm_detail {

struct FlightEntry {
  std::uint64_t seq = 0;
  std::string op;  // "all_reduce(sum)"
  std::uint64_t bytes = 0;
  std::string dtype;  // "float32"
  std::vector<std::int64_t> shape;
  std::vector<int> peers;           // world ranks taking part
  std::string state = "scheduled";  // completed, failed, timed_out, aborted, peer_lost
  std::chrono::system_clock::time_point start;
  std::chrono::system_clock::time_point end;
  std::string error;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(std::size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  void record(FlightEntry entry);
  // Marks entry `seq` finished (if still kept).
  void finish(std::uint64_t seq, const std::string& state, const std::string& error = {});
  // {"group": ..., "rank": ..., "entries": [...]} with ISO-8601 times.
  std::string json(const std::string& group, int rank, int size, int generation) const;

 private:
  mutable std::mutex mutex_;
  std::size_t capacity_;
  std::deque<FlightEntry> entries_;
};

}  // namespace keel::internal::comm_detail
