// Cases that need a group of ranks: keel-compat runs each rank as a process
// of its own (its hidden `comm-worker` command) on loopback. The parent
// writes every rank's inputs to a scratch file, starts the ranks, waits for
// all of them within a bound, and reads back what each wrote; the rank runs
// its family's `run_rank` on a keel communicator. The comm family and the
// vocabulary-parallel loss cases use it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "keel/v1/dispatch.h"
#include "keel/v1/error.h"
#include "suite/suite.h"

namespace keel::harness {

// How rank processes are started: `executable` is run as
// `EXECUTABLE comm-worker ...` (empty: this process's own, /proc/self/exe,
// which is keel-compat), and a case whose ranks have not all finished
// within `timeout` has them killed and errors with Errc::timeout.
struct CommLaunch {
  std::string executable;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};
void set_comm_launch(const CommLaunch& launch);
CommLaunch comm_launch();

// What one rank returned.
struct RankRun {
  std::map<std::string, at::Tensor> outputs;
  std::string adapter;  // the adapter that served the rank's call
  double ms = 0;        // the rank's run_rank, wall time
  std::int64_t peak_bytes = 0;
};

// Runs case `c` on `inputs.size()` ranks, rank r with `inputs[r]` (the
// case's id, operation and options go with them). The first rank to fail
// ends the case: Errc::unsupported when its build cannot serve the call,
// else backend_error with the rank's last log lines; Errc::timeout naming
// the ranks still running at the deadline.
result<std::vector<RankRun>> run_on_ranks(
    const Case& c, const std::vector<std::map<std::string, at::Tensor>>& inputs, Backend backend);

// keel-compat's hidden `comm-worker` command, one rank of a case:
//   comm-worker --case ID --rank R --port P --inputs FILE --out FILE
//               [--world N (default 2)] [--backend auto|compat|native]
// `args` are the words after "comm-worker". Returns the exit status: 0 done,
// 1 the case failed, 2 usage, 3 the build cannot serve it
// (Errc::unsupported); failures are printed to stderr.
int comm_worker_main(const std::vector<std::string>& args);

}  // namespace keel::harness
