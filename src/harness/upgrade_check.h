// record and compare: keel-compat's two halves. record runs the suite and
// stores inputs, outputs and metadata in one safetensors file; compare
// replays the stored inputs on this build and judges every output against
// the stored one under the tolerance policy, with a bitwise determinism
// check across repeats.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/suite.h"
#include "keel/v1/dispatch.h"
#include "keel/v1/error.h"

namespace keel::harness {

// The file format version this keel writes and the newest it reads.
inline constexpr int kFormatVersion = 1;

// Called before each case: (cases done, cases in all, the next case's id).
using Progress = std::function<void(std::size_t, std::size_t, const std::string&)>;

struct RecordOptions {
  std::string out;
  std::string filter;
  Backend backend = Backend::unset;
  Progress progress;
};

// Returns the number of cases recorded.
result<std::size_t> record(const RecordOptions& options);

struct OutputCheck {
  std::string name;
  Tolerance tolerance;  // the one it was judged by
  double max_abs = 0;
  double max_rel = 0;
  bool pass = true;
  // Why it failed, when the numbers alone do not say: a dtype or shape that
  // changed, or an integer output's first mismatch (index and both values).
  std::string detail;
};

struct CaseReport {
  std::string id, operation, dtype;
  nlohmann::json options = nlohmann::json::object();  // as recorded with the case
  std::string status;                                 // "pass", "fail", "skipped", "error"
  std::string reason;                                 // why skipped, failed or errored
  std::string golden_adapter, adapter;
  Tolerance tolerance;
  std::vector<OutputCheck> outputs;
  double max_abs = 0, max_rel = 0;
  bool deterministic = true;
  double golden_forward_ms = 0, golden_backward_ms = 0, forward_ms = 0, backward_ms = 0;
  std::int64_t golden_peak_bytes = 0, peak_bytes = 0;
};

struct Report {
  std::map<std::string, std::string> golden;  // the golden file's metadata, less its cases
  std::string keel_version, torch_version, backend;
  int repeat = 1;
  std::vector<CaseReport> cases;
  int passed = 0, failed = 0, skipped = 0, errors = 0;
};

struct CompareOptions {
  std::string golden;
  std::string filter;
  Backend backend = Backend::unset;
  int repeat = 2;
  Progress progress;
};

result<Report> compare(const CompareOptions& options);

nlohmann::json to_json(const Report& report);
std::string summary_text(const Report& report);
std::string to_html(const Report& report);

}  // namespace keel::harness
