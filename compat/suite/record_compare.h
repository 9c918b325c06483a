// record and compare over keel-compat's suite (suite.h): record runs every
// family's cases and stores inputs, outputs and metadata in one golden file
// (the engine's golden.h); compare replays the stored inputs on this build
// through the families and judges every output under the tolerance policy,
// with a bitwise determinism check across repeats.
#pragma once

#include <cstddef>
#include <string>

#include "engine/report.h"
#include "keel/v1/dispatch.h"
#include "keel/v1/error.h"

namespace keel::harness {

struct RecordOptions {
  std::string out;
  std::string filter;
  Backend backend = Backend::unset;
  Progress progress;
};

// Returns the number of cases recorded.
result<std::size_t> record(const RecordOptions& options);

result<Report> compare(const CompareOptions& options);

}  // namespace keel::harness
