/// @file keel/v1/compat.h
/// @brief `keel::compat`: record a service's own cases on one build, replay
/// them on another, and get a typed report of what moved.
///
/// The upgrade check keel runs on its own suite (`keel-compat`), offered
/// for a service's own work: on the old build, `record()` runs each case's
/// stored inputs through the service's function and writes inputs,
/// outputs, tolerance, time and peak memory into a golden file; on the new
/// build, `compare()` replays the stored inputs through the function and
/// judges every output against the stored one. It is one implementation
/// with `keel-compat`: the same file format (safetensors, readable by
/// Python's `safetensors`; `keel-compat diff` reads it too), the same
/// tolerance policy (docs/compat.md) and the same report writers.
///
/// In one line:
/// `keel::compat::record("golden.safetensors", cases, fn);` on the old build,
/// `auto report = keel::compat::compare("golden.safetensors", fn);` on the new.
///
/// In full:
///
/// @snippet examples/snippets/header_snippets.cpp compat
///
/// Traps:
/// - Every call's `keel::result` is `[[nodiscard]]`: ignoring one is a
///   warning (an error under `-Werror`); drop one on purpose with `(void)`.
///
/// Measuring peak memory installs a counting wrapper around libtorch's CPU
/// allocator on the first `record()` or `compare()`, for the rest of the
/// process: it forwards every call, and keeps each live allocation's size
/// in a table under a mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "keel/v1/error.h"
#include "keel/v1/export.h"

namespace keel {
inline namespace v1 {
namespace compat {

/// Named tensors: a case's inputs or outputs.
using Tensors = std::map<std::string, at::Tensor>;

/// An output passes when |got − want| ≤ atol + rtol·|want| element by
/// element (NaN matches NaN and an infinity the same infinity).
struct Tolerance {
  /// Absolute tolerance.
  double atol = 0;
  /// Relative tolerance, of the recorded value.
  double rtol = 0;
};

/// One named case: what the function is called with.
struct Case {
  /// Unique in the file, non-empty; '/' may structure it ("decode/step0"),
  /// but no path segment may be "in" or "out" (the file's tensor names use
  /// them).
  std::string id;
  /// The stored inputs (stored as CPU copies, and replayed on the CPU).
  Tensors inputs;
  /// The case's tolerance. Empty: the documented policy for the least
  /// precise floating dtype among the outputs (float64 1e-10, float32 1e-5,
  /// float16 1e-3, bfloat16 1e-2 absolute and 1.6e-2 relative), and exact
  /// for outputs with no floating dtype.
  std::optional<Tolerance> tolerance;
  /// Per output: overrides `tolerance` for the outputs it names (a loss
  /// curve judged by a convergence band beside logits judged by the dtype
  /// policy). Naming an output the function does not give is
  /// `invalid_argument` at record time.
  std::map<std::string, Tolerance> output_tolerances;
  /// Free-form strings stored with the case and handed back on replay.
  std::map<std::string, std::string> metadata;
};

/// The service's function: a case's outputs from its inputs. An error
/// makes the case an error in the report (`unsupported` skips it); so does
/// an exception.
using Function = std::function<result<Tensors>(const Case&)>;

/// Options of `record()`.
struct RecordOptions {
  /// Stored in the file's metadata beside keel's own, for the report to
  /// show: a model's name, a commit. keel's own keys (`keel_format`,
  /// `keel_version`, `torch_version`, `device`, `backend`, `cases`) are
  /// `invalid_argument` here.
  std::map<std::string, std::string> metadata;
};

/// Runs `function` once on each case and writes the golden file at `path`.
///
/// Errors: `invalid_argument` for a bad or repeated case id, or a tensor
/// with no name, undefined, or of a dtype the file cannot hold (complex); the function's own error,
/// naming the case, when it fails on one (`backend_error` when it throws);
/// `io_error` when the file cannot be written.
KEEL_API result<void> record(const std::string& path, const std::vector<Case>& cases,
                             const Function& function, const RecordOptions& options = {});

/// Options of `compare()`.
struct CompareOptions {
  /// Runs per case; outputs that differ bitwise between runs fail the case
  /// (a nondeterministic function cannot be checked across builds).
  int repeat = 2;
  /// Only cases whose id contains one of these comma-separated parts.
  std::string filter;
};

/// What happened to a case.
enum class CaseStatus : std::uint8_t {
  pass,     ///< every output within its tolerance, deterministically
  fail,     ///< an output moved beyond its tolerance, is missing, or is nondeterministic
  skipped,  ///< the function answered `unsupported`
  error,    ///< the function failed or threw; `reason` says how
};

/// One output of a case, judged.
struct OutputResult {
  /// The output's name.
  std::string name;
  /// The largest |got − want| (infinite when the shapes differ).
  double max_abs = 0;
  /// The largest |got − want| / |want|.
  double max_rel = 0;
  /// The tolerance it was judged by: its own, else the case's.
  Tolerance tolerance;
  /// Within that tolerance.
  bool pass = true;
};

/// One case of the report: errors, determinism, time and memory side by
/// side with the golden run.
struct CaseResult {
  /// The case's id.
  std::string id;
  /// The case's outcome.
  CaseStatus status = CaseStatus::pass;
  /// Why it did not pass; empty when it did.
  std::string reason;
  /// The tolerance it was judged by (the one recorded with it).
  Tolerance tolerance;
  /// Each recorded output, judged.
  std::vector<OutputResult> outputs;
  /// The largest absolute error over its outputs.
  double max_abs = 0;
  /// The largest relative error over its outputs.
  double max_rel = 0;
  /// Whether every run gave bitwise the same outputs.
  bool deterministic = true;
  /// The function's time, in milliseconds, when recorded.
  double golden_ms = 0;
  /// The function's time now: the median of `CompareOptions::repeat` runs.
  double ms = 0;
  /// Peak CPU tensor memory of one run, when recorded.
  std::int64_t golden_peak_bytes = 0;
  /// Peak CPU tensor memory of one run now (the largest over the runs).
  std::int64_t peak_bytes = 0;
  /// The case's metadata, as recorded.
  std::map<std::string, std::string> metadata;
};

/// The typed report of `compare()`.
struct Report {
  /// The golden file's metadata: keel's (`keel_version`, `torch_version`,
  /// `keel_format`, ...) and the service's (`RecordOptions::metadata`).
  std::map<std::string, std::string> golden;
  /// This build's keel version.
  std::string keel_version;
  /// This build's torch version.
  std::string torch_version;
  /// Runs per case.
  int repeat = 1;
  /// Every selected case, in the file's order.
  std::vector<CaseResult> cases;
  /// How many cases passed.
  int passed = 0;
  /// How many failed.
  int failed = 0;
  /// How many were skipped.
  int skipped = 0;
  /// How many errored.
  int errors = 0;
  /// True when no case failed or errored.
  bool ok() const { return failed == 0 && errors == 0; }
};

/// Replays the golden file at `path` through `function` and judges it.
///
/// Errors: `invalid_argument` for `repeat` < 1; `io_error` when the file
/// cannot be read; `corrupt_data` for a file that is not a golden file or
/// is damaged (never a crash); `unsupported` for a file written by a newer
/// keel's format.
KEEL_API result<Report> compare(const std::string& path, const Function& function,
                                const CompareOptions& options = {});

/// The report as a terminal summary: one line per case.
KEEL_API std::string to_text(const Report& report);
/// The report as JSON (the same schema as `keel-compat compare --json`).
KEEL_API std::string to_json(const Report& report);
/// The report as a self-contained HTML page with inline SVG plots (no
/// network assets).
KEEL_API std::string to_html(const Report& report);

}  // namespace compat
}  // namespace v1
}  // namespace keel
