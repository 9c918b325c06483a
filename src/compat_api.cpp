// keel::compat: the public face of keel-compat's golden-file engine
// (src/harness/golden.h). A service's cases are stored as operation
// "function", their metadata as the case's options; the engine, the file
// format and the report writers are keel-compat's own.
#include "keel/v1/compat.h"

#include <chrono>
#include <exception>
#include <iterator>
#include <utility>

#include <absl/strings/str_cat.h>
#include <nlohmann/json.hpp>

#include "dtype_name.h"
#include "harness/golden.h"
#include "harness/peak_memory.h"

namespace keel {
inline namespace v1 {
namespace compat {
namespace {

constexpr const char* kOperation = "function";

// The floating dtypes from most to least precise: a case is judged by the
// least precise among its outputs.
constexpr c10::ScalarType kByPrecision[] = {c10::kDouble, c10::kFloat, c10::kHalf, c10::kBFloat16};

std::string policy_dtype(const Tensors& outputs) {
  std::size_t worst = 0;  // one past the least precise seen
  for (const auto& [name, t] : outputs) {
    for (std::size_t i = 0; t.defined() && i < std::size(kByPrecision); ++i) {
      if (t.scalar_type() == kByPrecision[i]) worst = std::max(worst, i + 1);
    }
  }
  return worst == 0 ? std::string() : internal::dtype_name(kByPrecision[worst - 1]);
}

// One run of `function` on `c`, timed, with its peak memory.
result<harness::Run> run_once(const Function& function, const Case& c) {
  harness::PeakMemory memory;
  const auto start = std::chrono::steady_clock::now();
  result<Tensors> outputs = [&]() -> result<Tensors> {
    try {
      return function(c);
    } catch (const std::exception& e) {
      return Error(Errc::backend_error, absl::StrCat("the function threw: ", e.what()));
    } catch (...) {
      return Error(Errc::backend_error, "the function threw a non-standard exception");
    }
  }();
  if (!outputs) return outputs.error();
  // Judged and stored on the CPU, as values: an undefined output is the
  // function's error, not the engine's.
  for (auto& [name, t] : outputs.value()) {
    if (!t.defined()) {
      return Error(Errc::invalid_argument,
                   absl::StrCat("the function's output '", name, "' is an undefined tensor"));
    }
    t = t.detach().cpu();
  }
  harness::Run run;
  run.forward_ms = harness::elapsed_ms(start);
  run.peak_bytes = memory.peak_bytes();
  run.outputs = std::move(outputs).value();
  return run;
}

// The engine's status names, in CaseStatus order.
constexpr const char* kStatusNames[] = {"pass", "fail", "skipped", "error"};

CaseStatus status_of(const std::string& s) {
  for (std::size_t i = 0; i < std::size(kStatusNames); ++i) {
    if (s == kStatusNames[i]) return static_cast<CaseStatus>(i);
  }
  return CaseStatus::error;
}

const char* status_text(CaseStatus s) {
  const auto i = static_cast<std::size_t>(s);
  return i < std::size(kStatusNames) ? kStatusNames[i] : "error";
}

std::map<std::string, std::string> metadata_of(const nlohmann::json& options) {
  std::map<std::string, std::string> m;
  if (!options.is_object()) return m;
  for (const auto& [key, value] : options.items()) {
    m[key] = value.is_string() ? value.get<std::string>() : value.dump();
  }
  return m;
}

Report from_engine(const harness::Report& in) {
  Report out;
  out.golden = in.golden;
  out.keel_version = in.keel_version;
  out.torch_version = in.torch_version;
  out.repeat = in.repeat;
  out.passed = in.passed;
  out.failed = in.failed;
  out.skipped = in.skipped;
  out.errors = in.errors;
  for (const harness::CaseReport& r : in.cases) {
    CaseResult c;
    c.id = r.id;
    c.status = status_of(r.status);
    c.reason = r.reason;
    c.tolerance = r.tolerance;
    for (const harness::OutputCheck& o : r.outputs) {
      c.outputs.push_back({o.name, o.max_abs, o.max_rel, o.tolerance, o.pass});
    }
    c.max_abs = r.max_abs;
    c.max_rel = r.max_rel;
    c.deterministic = r.deterministic;
    c.golden_ms = r.golden_forward_ms;
    c.ms = r.forward_ms;
    c.golden_peak_bytes = r.golden_peak_bytes;
    c.peak_bytes = r.peak_bytes;
    c.metadata = metadata_of(r.options);
    out.cases.push_back(std::move(c));
  }
  return out;
}

harness::Report to_engine(const Report& in) {
  harness::Report out;
  out.golden = in.golden;
  out.keel_version = in.keel_version;
  out.torch_version = in.torch_version;
  out.backend = kOperation;
  out.repeat = in.repeat;
  out.passed = in.passed;
  out.failed = in.failed;
  out.skipped = in.skipped;
  out.errors = in.errors;
  for (const CaseResult& c : in.cases) {
    harness::CaseReport r;
    r.id = c.id;
    r.operation = kOperation;
    r.golden_adapter = r.adapter = kOperation;
    r.status = status_text(c.status);
    r.reason = c.reason;
    r.tolerance = c.tolerance;
    for (const OutputResult& o : c.outputs) {
      r.outputs.push_back({o.name, o.tolerance, o.max_abs, o.max_rel, o.pass, {}});
    }
    r.max_abs = c.max_abs;
    r.max_rel = c.max_rel;
    r.deterministic = c.deterministic;
    r.golden_forward_ms = c.golden_ms;
    r.forward_ms = c.ms;
    r.golden_peak_bytes = c.golden_peak_bytes;
    r.peak_bytes = c.peak_bytes;
    out.cases.push_back(std::move(r));
  }
  return out;
}

}  // namespace

result<void> record(const std::string& path, const std::vector<Case>& cases,
                    const Function& function, const RecordOptions& options) {
  if (!function) return Error(Errc::invalid_argument, "keel::compat::record: function is empty");
  std::vector<harness::Recorded> recorded;
  for (const Case& c : cases) {
    result<harness::Run> run = run_once(function, c);
    if (!run) {
      return Error(run.error().code(), absl::StrCat("keel::compat::record: case '", c.id,
                                                    "': ", run.error().message()));
    }
    harness::Recorded r;
    r.c.id = c.id;
    r.c.operation = kOperation;
    r.c.dtype = policy_dtype(run.value().outputs);
    r.c.options = c.metadata;
    r.c.inputs = c.inputs;
    r.c.tolerance = c.tolerance;
    r.c.output_tolerances = c.output_tolerances;
    r.run = std::move(run).value();
    recorded.push_back(std::move(r));
  }
  result<void> written = harness::write_golden(path, recorded, kOperation, options.metadata);
  if (!written) {
    return Error(written.error().code(),
                 absl::StrCat("keel::compat::record: ", written.error().message()));
  }
  return success();
}

result<Report> compare(const std::string& path, const Function& function,
                       const CompareOptions& options) {
  if (!function) return Error(Errc::invalid_argument, "keel::compat::compare: function is empty");
  harness::CompareOptions o;
  o.golden = path;
  o.filter = options.filter;
  o.repeat = options.repeat;
  // Every case runs through the one function, whatever its operation.
  result<harness::Report> report =
      harness::compare_golden(o, [&](const std::string&) -> harness::Runner {
        return [&](const harness::Case& stored) -> result<harness::Run> {
          Case c;
          c.id = stored.id;
          c.inputs = stored.inputs;
          c.metadata = metadata_of(stored.options);
          return run_once(function, c);
        };
      });
  if (!report) {
    return Error(report.error().code(),
                 absl::StrCat("keel::compat::compare: ", report.error().message()));
  }
  return from_engine(report.value());
}

std::string to_text(const Report& report) {
  return harness::summary_text(to_engine(report));
}

std::string to_json(const Report& report) {
  return harness::to_json(to_engine(report)).dump(2);
}

std::string to_html(const Report& report) {
  return harness::to_html(to_engine(report));
}

}  // namespace compat
}  // namespace v1
}  // namespace keel
