// The compare report, the engine's one model of it: each case's status and
// each output's check against the golden file, with the timings and peak
// memory of both builds; and its three writers (JSON for machines, a
// terminal summary, a self-contained HTML page). keel-compat's suite and the
// public keel::compat both report through it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "case.h"
#include "keel/v1/dispatch.h"

namespace keel::harness {

// The file format version this keel writes and the newest it reads.
inline constexpr int kFormatVersion = 1;

// Called before each case: (cases done, cases in all, the next case's id).
using Progress = std::function<void(std::size_t, std::size_t, const std::string&)>;

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

nlohmann::json to_json(const Report& report);
std::string summary_text(const Report& report);
std::string to_html(const Report& report);

}  // namespace keel::harness
