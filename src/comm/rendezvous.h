// Rendezvous: where the store is and who this rank is, from CommOptions and
// the environment (torchrun's, then Slurm's), and the store itself.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dispatch/comm.h"
#include "keel/v1/comm.h"
#include "keel/v1/error.h"

namespace keel::internal::comm_detail {

struct RendezvousPlan {
  enum class Kind { tcp, file } kind = Kind::tcp;
  std::string host;  // tcp
  int port = 0;      // tcp
  std::string path;  // file
  int rank = 0;
  int world_size = 1;
  int local_rank = -1;
  // No rank hosts the store: torchrun's agent does
  // (TORCHELASTIC_USE_AGENT_STORE=True), or a process of the job's own,
  // such as keel-store (tcp://host:port?store=external). Every rank, rank
  // 0 included, then connects to it, and any rank may die and be survived.
  bool external_store = false;
  std::string store_owner = "rank 0";  // for messages: who hosts the store
  int restart_count = 0;               // TORCHELASTIC_RESTART_COUNT
  std::string described;               // "tcp://127.0.0.1:29500 (torchrun's environment)"
};

result<RendezvousPlan> plan_rendezvous(const comm::CommOptions& options);

// Opens (rank 0: hosts, unless the agent does) the store by `deadline`;
// `timeout` becomes the store's own timeout. A rank that connects waits for
// the host's port to accept by itself, so that an address nobody serves
// is a timeout at the deadline (c10d's own connect loop overshoots it by
// seconds). c10d's failure is read by `kernel` (its wording is the
// release's).
result<c10::intrusive_ptr<c10d::Store>> open_store(const RendezvousPlan& plan,
                                                   std::chrono::milliseconds timeout,
                                                   std::chrono::steady_clock::time_point deadline,
                                                   const internal::CommKernel& kernel);

// The address Gloo should bind: loopback when the store is on loopback (a
// single machine), else empty (Gloo resolves the host name).
std::string gloo_host(const RendezvousPlan& plan);

// Every rank sets `<prefix>arrive/<rank>`, then waits (polling `check`)
// for all `size` ranks until `deadline`; a timeout names the ranks that
// never arrived. `what` names the group in messages. `hosted_by_rank0`:
// the store lives in rank 0's process, so losing it means losing rank 0;
// on a timeout rank 0 then stays (at most 1 s) until every rank that
// arrived has read the verdict.
result<void> await_arrival(c10d::Store& store, const std::string& prefix, int rank, int size,
                           std::chrono::steady_clock::time_point deadline, const std::string& what,
                           bool hosted_by_rank0);

// "0, 2, 3" (at most 16 listed, then "and N more").
std::string list_ranks(const std::vector<int>& ranks);

}  // namespace keel::internal::comm_detail
