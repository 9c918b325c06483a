// keel::compat: the public face of keel-compat's golden-file engine
// (compat/engine/golden.h). A service's cases are stored as operation
// "function", their metadata as the case's options; the engine, the file
// format and the report writers are keel-compat's own.
#include "keel/v1/compat.h"

#include <chrono>
#include <exception>
#include <iterator>
#include <utility>

#include <absl/strings/str_cat.h>
#include <nlohmann/json.hpp>

#include "golden.h"
#include "keel/v1/dtype.h"
#include "peak_memory.h"

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
  return worst == 0 ? std::string() : keel::dtype_name(kByPrecision[worst - 1]);
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

// The fields the public report and the engine's share, one row each, as
// pairs of references: from_engine and to_engine both read these tables, so
// a field added to one model and not here is in neither direction.
template <typename E, typename P, typename Same>
void shared_report_fields(E& e, P& p, Same&& same) {
  same(e.golden, p.golden);
  same(e.keel_version, p.keel_version);
  same(e.torch_version, p.torch_version);
  same(e.repeat, p.repeat);
  same(e.passed, p.passed);
  same(e.failed, p.failed);
  same(e.skipped, p.skipped);
  same(e.errors, p.errors);
}

template <typename E, typename P, typename Same>
void shared_case_fields(E& e, P& p, Same&& same) {
  same(e.id, p.id);
  same(e.reason, p.reason);
  same(e.tolerance, p.tolerance);
  same(e.max_abs, p.max_abs);
  same(e.max_rel, p.max_rel);
  same(e.deterministic, p.deterministic);
  same(e.golden_forward_ms, p.golden_ms);
  same(e.forward_ms, p.ms);
  same(e.golden_peak_bytes, p.golden_peak_bytes);
  same(e.peak_bytes, p.peak_bytes);
}

template <typename E, typename P, typename Same>
void shared_output_fields(E& e, P& p, Same&& same) {
  same(e.name, p.name);
  same(e.tolerance, p.tolerance);
  same(e.max_abs, p.max_abs);
  same(e.max_rel, p.max_rel);
  same(e.pass, p.pass);
}

// Reads a table from the engine's model into the public one, or back.
constexpr auto kToPublic = [](const auto& engine, auto& public_field) { public_field = engine; };
constexpr auto kToEngine = [](auto& engine, const auto& public_field) { engine = public_field; };

Report from_engine(const harness::Report& in) {
  Report out;
  shared_report_fields(in, out, kToPublic);
  for (const harness::CaseReport& r : in.cases) {
    CaseResult c;
    shared_case_fields(r, c, kToPublic);
    c.status = status_of(r.status);
    c.metadata = metadata_of(r.options);
    for (const harness::OutputCheck& o : r.outputs) {
      OutputResult output;
      shared_output_fields(o, output, kToPublic);
      c.outputs.push_back(std::move(output));
    }
    out.cases.push_back(std::move(c));
  }
  return out;
}

// The engine's fields that the public report lacks: every case ran through
// the one function (operation, adapters and backend "function").
harness::Report to_engine(const Report& in) {
  harness::Report out;
  shared_report_fields(out, in, kToEngine);
  out.backend = kOperation;
  for (const CaseResult& c : in.cases) {
    harness::CaseReport r;
    shared_case_fields(r, c, kToEngine);
    r.status = status_text(c.status);
    r.operation = kOperation;
    r.golden_adapter = r.adapter = kOperation;
    for (const OutputResult& o : c.outputs) {
      harness::OutputCheck output;
      shared_output_fields(output, o, kToEngine);
      r.outputs.push_back(std::move(output));
    }
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
