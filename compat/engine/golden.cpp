#include "golden.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include <ATen/ATen.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>

#include "diff.h"
#include "keel/v1/build_info.h"
#include "keel/v1/dtype.h"
#include "safetensors.h"

namespace keel::harness {
namespace {

std::string in_name(const std::string& id, const std::string& name) {
  return id + "/in/" + name;
}
std::string out_name(const std::string& id, const std::string& name) {
  return id + "/out/" + name;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.contiguous();
  const at::Tensor y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

// |got - want| against atol + rtol * |want| (check_values, which diff
// shares); outputs of different shapes fail outright.
OutputCheck check_output(const std::string& name, const at::Tensor& got, const at::Tensor& want,
                         const Tolerance& tol) {
  OutputCheck check;
  check.name = name;
  check.tolerance = tol;
  const auto fail_outright = [&](const std::string& why) {
    check.pass = false;
    check.max_abs = check.max_rel = std::numeric_limits<double>::infinity();
    check.detail = absl::StrCat("output '", name, "': ", why);
    return check;
  };
  if (got.scalar_type() != want.scalar_type()) {
    return fail_outright(
        absl::StrCat("dtype ", keel::dtype_name(got), ", recorded ", keel::dtype_name(want)));
  }
  if (got.sizes() != want.sizes()) {
    return fail_outright(absl::StrCat("shape ", absl::StrJoin(got.sizes(), "x"), ", recorded ",
                                      absl::StrJoin(want.sizes(), "x")));
  }
  const ValueCheck values = check_values(want, got, tol, /*worst=*/1);
  check.max_abs = values.max_abs;
  check.max_rel = values.max_rel;
  check.pass = values.pass;
  if (!values.pass && values.exact) {
    const WorstElement& first = values.worst.front();
    check.detail = absl::StrCat("output '", name, "' ", keel::dtype_name(want), " at [",
                                absl::StrJoin(first.index, ", "), "]: ", first.b_int, ", recorded ",
                                first.a_int, " (", values.mismatched,
                                " elements differ; integer outputs must match exactly)");
  }
  return check;
}

// A case's tensors are stored as "<id>/in/<name>" and "<id>/out/<name>":
// an id with a path segment "in" or "out" could read another case's.
result<void> check_id(const std::string& id) {
  if (id.empty()) return Error(Errc::invalid_argument, "a case id is empty");
  for (absl::string_view part : absl::StrSplit(id, '/')) {
    if (part == "in" || part == "out") {
      return Error(Errc::invalid_argument,
                   absl::StrCat("case id '", id,
                                "' has a path segment 'in' or 'out', which the file's tensor "
                                "names use"));
    }
  }
  return success();
}

}  // namespace

Tolerance tolerance_for(const std::string& dtype) {
  // float32 and the half types accumulate in float32 in every keel
  // operation, so their outputs differ across releases only by summation
  // order; the half types' inputs are exact in the file.
  if (dtype == "float64") return {1e-10, 1e-10};
  if (dtype == "float32") return {1e-5, 1e-5};
  if (dtype == "bfloat16") return {1e-2, 1.6e-2};
  if (dtype == "float16") return {1e-3, 1e-3};
  return {0, 0};
}

bool matches_filter(const std::string& id, const std::string& filter) {
  if (filter.empty()) return true;
  for (absl::string_view part : absl::StrSplit(filter, ',', absl::SkipEmpty())) {
    if (id.find(part.data(), 0, part.size()) != std::string::npos) return true;
  }
  return false;
}

result<void> write_golden(const std::string& path, const std::vector<Recorded>& cases,
                          const std::string& backend,
                          const std::map<std::string, std::string>& metadata) {
  TensorFile file;
  for (const auto& [key, value] : metadata) {
    if (key == "keel_format" || key == "keel_version" || key == "torch_version" ||
        key == "device" || key == "backend" || key == "cases") {
      return Error(Errc::invalid_argument,
                   absl::StrCat("metadata key '", key, "' is keel's own; name it otherwise"));
    }
  }
  nlohmann::json entries = nlohmann::json::array();
  std::set<std::string> ids;
  for (const Recorded& r : cases) {
    const Case& c = r.c;
    if (result<void> ok = check_id(c.id); !ok) return ok.error();
    if (!ids.insert(c.id).second) {
      return Error(Errc::invalid_argument, absl::StrCat("case id '", c.id, "' is repeated"));
    }
    for (const auto* tensors : {&c.inputs, &r.run.outputs}) {
      for (const auto& [name, t] : *tensors) {
        if (name.empty()) {
          return Error(Errc::invalid_argument,
                       absl::StrCat("case ", c.id, ": a tensor has no name"));
        }
        // Unique: ids are, and none has a path segment "in" or "out".
        file.tensors[tensors == &c.inputs ? in_name(c.id, name) : out_name(c.id, name)] = t;
      }
    }
    const Tolerance tol = c.tolerance.value_or(tolerance_for(c.dtype));
    nlohmann::json per_output = nlohmann::json::object();
    for (const auto& [name, t] : c.output_tolerances) {
      if (r.run.outputs.count(name) == 0) {
        return Error(Errc::invalid_argument,
                     absl::StrCat("case ", c.id, ": a tolerance names output '", name,
                                  "', which the run did not give"));
      }
      per_output[name] = {{"atol", t.atol}, {"rtol", t.rtol}};
    }
    entries.push_back({{"id", c.id},
                       {"output_tolerances", per_output},
                       {"operation", c.operation},
                       {"dtype", c.dtype},
                       {"options", c.options},
                       {"adapter", r.run.adapter},
                       {"forward_ms", r.run.forward_ms},
                       {"backward_ms", r.run.backward_ms},
                       {"peak_bytes", r.run.peak_bytes},
                       {"atol", tol.atol},
                       {"rtol", tol.rtol}});
  }
  const BuildInfo& info = build_info();
  file.metadata = metadata;
  file.metadata["keel_format"] = std::to_string(kFormatVersion);
  file.metadata["keel_version"] = info.keel_version;
  file.metadata["torch_version"] = info.torch_version;
  file.metadata["device"] = "cpu";
  file.metadata["backend"] = backend;
  file.metadata["cases"] = entries.dump();
  return write_safetensors(path, file);
}

result<Report> compare_golden(const CompareOptions& options, const RunnerFor& runner_for) {
  if (options.repeat < 1) {
    return Error(Errc::invalid_argument,
                 absl::StrCat("compare: --repeat is ", options.repeat, "; expected at least 1"));
  }
  result<TensorFile> file = read_safetensors(options.golden);
  if (!file) return file.error();
  const auto& meta = file.value().metadata;
  const auto format = meta.find("keel_format");
  if (format == meta.end()) {
    return Error(Errc::corrupt_data, absl::StrCat("compare: '", options.golden,
                                                  "' is a safetensors file but not keel-compat's "
                                                  "(no keel_format in __metadata__)"));
  }
  int version = 0;
  if (!absl::SimpleAtoi(format->second, &version) || version < 1) {
    return Error(Errc::corrupt_data, absl::StrCat("compare: keel_format '", format->second,
                                                  "' is not a format version"));
  }
  if (version > kFormatVersion) {
    return Error(
        Errc::unsupported,
        absl::StrCat("compare: '", options.golden, "' is keel-compat format ", version,
                     ", written by a newer keel (",
                     meta.count("keel_version") != 0u ? meta.at("keel_version") : "unknown",
                     "); this keel ", build_info().keel_version, " reads format ", kFormatVersion,
                     " and older"));
  }
  const auto cases_text = meta.find("cases");
  const nlohmann::json cases = cases_text == meta.end()
                                   ? nlohmann::json()
                                   : nlohmann::json::parse(cases_text->second, nullptr, false);
  if (!cases.is_array()) {
    return Error(Errc::corrupt_data,
                 "compare: the golden file's 'cases' metadata is not a JSON array");
  }

  Report report;
  for (const auto& [key, value] : meta) {
    if (key != "cases") report.golden[key] = value;
  }
  report.keel_version = build_info().keel_version;
  report.torch_version = build_info().torch_version;
  report.backend = std::string(
      to_string(options.backend == Backend::unset ? Backend::automatic : options.backend));
  report.repeat = options.repeat;

  std::vector<const nlohmann::json*> selected;
  for (const nlohmann::json& entry : cases) {
    if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_string()) {
      return Error(Errc::corrupt_data, "compare: a case in the golden file has no string 'id'");
    }
    if (matches_filter(entry["id"].get<std::string>(), options.filter)) selected.push_back(&entry);
  }
  for (std::size_t i = 0; i < selected.size(); ++i) {
    const nlohmann::json& entry = *selected[i];
    CaseReport r;
    r.id = entry["id"].get<std::string>();
    if (options.progress) options.progress(i, selected.size(), r.id);
    Case c;
    try {  // a field of the wrong type throws
      r.operation = entry.value("operation", "");
      r.dtype = entry.value("dtype", "");
      r.golden_adapter = entry.value("adapter", "");
      r.golden_forward_ms = entry.value("forward_ms", 0.0);
      r.golden_backward_ms = entry.value("backward_ms", 0.0);
      r.golden_peak_bytes = entry.value("peak_bytes", std::int64_t{0});
      // The tolerance recorded with the case is the one it is judged by.
      r.tolerance = tolerance_for(r.dtype);
      r.tolerance.atol = entry.value("atol", r.tolerance.atol);
      r.tolerance.rtol = entry.value("rtol", r.tolerance.rtol);
      c.options = r.options = entry.value("options", nlohmann::json::object());
      const nlohmann::json per_output = entry.value("output_tolerances", nlohmann::json::object());
      for (const auto& [name, t] : per_output.items()) {
        c.output_tolerances[name] = {t.at("atol").get<double>(), t.at("rtol").get<double>()};
      }
    } catch (const nlohmann::json::exception& e) {
      return Error(Errc::corrupt_data, absl::StrCat("compare: case ", r.id,
                                                    " in the golden file has a field of the wrong "
                                                    "type (",
                                                    e.what(), ")"));
    }
    const Runner runner = runner_for(r.operation);
    if (!runner) {
      r.status = "skipped";
      r.reason = absl::StrCat("this build has no case family '", r.operation, "'");
      report.cases.push_back(std::move(r));
      continue;
    }
    c.id = r.id;
    c.operation = r.operation;
    c.dtype = r.dtype;
    const std::string prefix = r.id + "/in/";
    const std::string out_prefix = r.id + "/out/";
    std::map<std::string, at::Tensor> golden_outputs;
    for (const auto& [name, t] : file.value().tensors) {
      if (name.rfind(prefix, 0) == 0) c.inputs[name.substr(prefix.size())] = t;
      if (name.rfind(out_prefix, 0) == 0) golden_outputs[name.substr(out_prefix.size())] = t;
    }
    std::vector<Run> runs;
    std::string failure;
    bool unsupported = false;
    try {
      for (int k = 0; k < options.repeat && failure.empty(); ++k) {
        result<Run> run = runner(c);
        if (run) {
          runs.push_back(std::move(run).value());
        } else {
          failure = run.error().to_string();
          unsupported = run.error().code() == Errc::unsupported;
        }
      }
    } catch (const std::exception& e) {  // stored inputs that do not fit the runner
      failure = absl::StrCat("corrupt_data: the stored case does not replay: ", e.what());
    }
    if (!failure.empty()) {
      // A valid case that the requested backend cannot serve (native and a
      // mask, say) is skipped, not failed: the report says why.
      r.status = unsupported ? "skipped" : "error";
      r.reason = failure;
      report.cases.push_back(std::move(r));
      continue;
    }
    r.adapter = runs.front().adapter;
    std::vector<double> fwd, bwd;
    for (const Run& run : runs) {
      fwd.push_back(run.forward_ms);
      bwd.push_back(run.backward_ms);
      r.peak_bytes = std::max(r.peak_bytes, run.peak_bytes);
      // The same names, bitwise the same values.
      if (run.outputs.size() != runs.front().outputs.size()) r.deterministic = false;
      for (const auto& [name, t] : run.outputs) {
        const auto first = runs.front().outputs.find(name);
        if (first == runs.front().outputs.end() || !bitwise_equal(t, first->second)) {
          r.deterministic = false;
        }
      }
    }
    r.forward_ms = median(fwd);
    r.backward_ms = median(bwd);
    bool pass = true;
    for (const auto& [name, want] : golden_outputs) {
      const auto got = runs.front().outputs.find(name);
      if (got == runs.front().outputs.end()) {
        pass = false;
        r.reason = absl::StrCat("this build produces no output '", name, "'");
        continue;
      }
      const auto own = c.output_tolerances.find(name);
      OutputCheck check = check_output(
          name, got->second, want, own == c.output_tolerances.end() ? r.tolerance : own->second);
      r.max_abs = std::max(r.max_abs, check.max_abs);
      r.max_rel = std::max(r.max_rel, check.max_rel);
      if (!check.pass && r.reason.empty()) r.reason = check.detail;
      pass = pass && check.pass;
      r.outputs.push_back(std::move(check));
    }
    if (golden_outputs.empty()) {
      pass = false;
      r.reason = "the golden file holds no outputs for this case";
    }
    if (!r.deterministic) {
      pass = false;
      r.reason = absl::StrCat("outputs differ bitwise across ", options.repeat, " runs");
    }
    r.status = pass ? "pass" : "fail";
    if (!pass && r.reason.empty()) {
      r.reason =
          absl::StrFormat("max abs error %.3g, max rel error %.3g beyond atol %.1g rtol %.1g",
                          r.max_abs, r.max_rel, r.tolerance.atol, r.tolerance.rtol);
    }
    report.cases.push_back(std::move(r));
  }
  if (options.progress) options.progress(selected.size(), selected.size(), "");
  for (const CaseReport& r : report.cases) {
    report.passed += r.status == "pass";
    report.failed += r.status == "fail";
    report.skipped += r.status == "skipped";
    report.errors += r.status == "error";
  }
  return report;
}

}  // namespace keel::harness
