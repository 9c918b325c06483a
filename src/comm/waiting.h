// Bounded waiting and failure: every wait on a c10d work is cut into slices
// that watch the heartbeats and the group's abort flag, and ends by its
// deadline; a failure aborts the group, dumps the flight recorder and names
// the lost peer when the heartbeats tell.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/state.h"
#include "keel/v1/error.h"

namespace keel {
inline namespace v1 {
namespace comm::detail {

// "rank 2 stopped sending heartbeats 3100 ms ago; ..."
std::string describe_lost(const GroupState& g, const std::vector<LostPeer>& lost);
// Writes the flight recorder to `path` (empty: KEEL_COMM_TRACE_DIR or the
// temporary directory); the path written.
result<std::string> write_trace(GroupState& g, const std::string& path);
// A failure of operation `seq`: aborts the group, dumps the flight
// recorder, logs, and returns `error` with the dump's path.
Error fail(GroupState& g, std::uint64_t seq, const char* state, const Error& error);
// Errc::aborted for `what`, with the group's first abort cause.
Error aborted_error(GroupState& g, const std::string& what);
// Fails operation `seq` after c10d reported `text`: peer_lost naming the
// rank when the heartbeats tell one died (waiting for them up to `limit`),
// else the code the adapter reads in `text`.
Error fail_from_c10d(GroupState& g, std::uint64_t seq, const std::string& what,
                     const std::string& text, Clock::time_point limit);
// Waits for `w` until `deadline`, in slices that watch the heartbeats.
result<void> wait_work(WorkState& w, Clock::time_point deadline);

}  // namespace comm::detail
}  // namespace v1
}  // namespace keel
