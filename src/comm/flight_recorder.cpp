#include "comm/flight_recorder.h"

#include <algorithm>

#include <absl/time/time.h>
#include <nlohmann/json.hpp>

namespace keel::internal::comm_detail {
namespace {

std::string iso(std::chrono::system_clock::time_point t) {
  if (t == std::chrono::system_clock::time_point{}) return {};
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::FromChrono(t), absl::UTCTimeZone());
}

}  // namespace

void FlightRecorder::record(FlightEntry entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.size() == capacity_) entries_.pop_front();
  entries_.push_back(std::move(entry));
}

void FlightRecorder::finish(std::uint64_t seq, const std::string& state, const std::string& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The newest entry with this sequence number (a later one may reuse it).
  const auto it = std::find_if(entries_.rbegin(), entries_.rend(),
                               [&](const FlightEntry& e) { return e.seq == seq; });
  if (it == entries_.rend()) return;
  it->state = state;
  it->error = error;
  it->end = std::chrono::system_clock::now();
}

std::string FlightRecorder::json(const std::string& group, int rank, int size,
                                 int generation) const {
  nlohmann::json doc;
  doc["group"] = group;
  doc["rank"] = rank;
  doc["size"] = size;
  doc["generation"] = generation;
  doc["entries"] = nlohmann::json::array();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const FlightEntry& e : entries_) {
    nlohmann::json j;
    j["seq"] = e.seq;
    j["op"] = e.op;
    j["bytes"] = e.bytes;
    j["dtype"] = e.dtype;
    j["shape"] = e.shape;
    j["peers"] = e.peers;
    j["state"] = e.state;
    j["start"] = iso(e.start);
    j["end"] = iso(e.end);
    if (e.end != std::chrono::system_clock::time_point{}) {
      j["duration_us"] =
          std::chrono::duration_cast<std::chrono::microseconds>(e.end - e.start).count();
    }
    if (!e.error.empty()) j["error"] = e.error;
    doc["entries"].push_back(std::move(j));
  }
  return doc.dump(2);
}

}  // namespace keel::internal::comm_detail
