#include "harness/upgrade_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <ATen/ATen.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include "harness/diff.h"
#include "harness/safetensors.h"
#include "keel/v1/build_info.h"

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
  if (got.sizes() != want.sizes()) {
    check.pass = false;
    check.max_abs = check.max_rel = std::numeric_limits<double>::infinity();
    return check;
  }
  const ValueCheck values = check_values(want, got, tol);
  check.max_abs = values.max_abs;
  check.max_rel = values.max_rel;
  check.pass = values.pass;
  return check;
}

}  // namespace

result<std::size_t> record(const RecordOptions& options) {
  TensorFile file;
  nlohmann::json cases = nlohmann::json::array();
  std::vector<Case> selected;
  for (const auto& family : families()) {
    for (Case& c : family->make_cases()) {
      if (matches_filter(c.id, options.filter)) selected.push_back(std::move(c));
    }
  }
  if (selected.empty()) {
    return Error(Errc::invalid_argument,
                 absl::StrCat("record: --filter '", options.filter, "' selects no case"));
  }
  for (std::size_t i = 0; i < selected.size(); ++i) {
    const Case& c = selected[i];
    if (options.progress) options.progress(i, selected.size(), c.id);
    result<Run> run = find_family(c.operation)->run(c, options.backend);
    if (!run) {
      return Error(run.error().code(),
                   absl::StrCat("record: case ", c.id, ": ", run.error().message()));
    }
    for (const auto& [name, t] : c.inputs) file.tensors[in_name(c.id, name)] = t;
    for (const auto& [name, t] : run.value().outputs) file.tensors[out_name(c.id, name)] = t;
    const Tolerance tol = c.tolerance.value_or(tolerance_for(c.dtype));
    cases.push_back({{"id", c.id},
                     {"operation", c.operation},
                     {"dtype", c.dtype},
                     {"options", c.options},
                     {"adapter", run.value().adapter},
                     {"forward_ms", run.value().forward_ms},
                     {"backward_ms", run.value().backward_ms},
                     {"peak_bytes", run.value().peak_bytes},
                     {"atol", tol.atol},
                     {"rtol", tol.rtol}});
  }
  if (options.progress) options.progress(selected.size(), selected.size(), "");
  const BuildInfo& info = build_info();
  file.metadata["keel_format"] = std::to_string(kFormatVersion);
  file.metadata["keel_version"] = info.keel_version;
  file.metadata["torch_version"] = info.torch_version;
  file.metadata["device"] = "cpu";
  file.metadata["backend"] = std::string(
      to_string(options.backend == Backend::unset ? Backend::automatic : options.backend));
  file.metadata["cases"] = cases.dump();
  result<void> written = write_safetensors(options.out, file);
  if (!written) return written.error();
  return selected.size();
}

result<Report> compare(const CompareOptions& options) {
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
    const Family* family = find_family(r.operation);
    if (family == nullptr) {
      r.status = "skipped";
      r.reason = absl::StrCat("this build has no case family '", r.operation, "'");
      report.cases.push_back(std::move(r));
      continue;
    }
    Case c;
    c.id = r.id;
    c.operation = r.operation;
    c.dtype = r.dtype;
    c.options = entry.value("options", nlohmann::json::object());
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
        result<Run> run = family->run(c, options.backend);
        if (run) {
          runs.push_back(std::move(run).value());
        } else {
          failure = run.error().to_string();
          unsupported = run.error().code() == Errc::unsupported;
        }
      }
    } catch (const std::exception& e) {  // a case whose stored inputs do not fit its family
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
      for (const auto& [name, t] : run.outputs) {
        if (!bitwise_equal(t, runs.front().outputs.at(name))) r.deterministic = false;
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
      OutputCheck check = check_output(name, got->second, want, r.tolerance);
      r.max_abs = std::max(r.max_abs, check.max_abs);
      r.max_rel = std::max(r.max_rel, check.max_rel);
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
