// The golden file's engine, one implementation for keel-compat (whose cases
// run through its suite's families) and for the public keel::compat API
// (whose cases run through a service's own function): write the cases with
// their inputs, outputs, tolerance and timings; read them back, replay the
// stored inputs through a runner, and judge every output under the
// tolerance policy, with a bitwise determinism check across repeats.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "case.h"
#include "keel/v1/error.h"
#include "report.h"

namespace keel::harness {

// A case with what one run of it gave.
struct Recorded {
  Case c;
  Run run;
};

// Writes `cases` to `path` with the format's metadata (keel_format, keel
// and torch versions, device, `backend`) and `metadata` beside it.
// `invalid_argument` when a case id or a tensor name could collide with
// another in the file.
result<void> write_golden(const std::string& path, const std::vector<Recorded>& cases,
                          const std::string& backend,
                          const std::map<std::string, std::string>& metadata = {});

// Runs one case on this build. `unsupported` skips the case (the report
// says why); any other error, or an exception, makes it an error.
using Runner = std::function<result<Run>(const Case&)>;
// The runner for a case's operation; an empty one skips the case ("this
// build has no case family ...").
using RunnerFor = std::function<Runner(const std::string& operation)>;

// Replays `options.golden` (its cases that pass `options.filter`) through
// `runner_for`. `corrupt_data` for a file that is not a golden file,
// `unsupported` for one written in a newer format.
result<Report> compare_golden(const CompareOptions& options, const RunnerFor& runner_for);

}  // namespace keel::harness
