// The compare and diff reports three ways: JSON for machines, a terminal
// summary, and a self-contained HTML page whose plots are keel's own inline
// SVG (no network assets, no plotting tool).
#include <algorithm>
#include <cmath>
#include <sstream>

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_replace.h>

#include "diff.h"
#include "report.h"

namespace keel::harness {
namespace {

std::string escape(const std::string& s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

std::string mib(std::int64_t bytes) {
  return absl::StrFormat("%.2f", static_cast<double>(bytes) / 1048576.0);
}

std::string ratio(double now, double before) {
  return before > 0 ? absl::StrFormat("%.2f", now / before) : "-";
}

// A horizontal bar chart, one row a case, one or two bars a row.
std::string bars(const std::string& title, const std::vector<std::string>& labels,
                 const std::vector<double>& a, const std::vector<double>& b,
                 const std::string& a_name, const std::string& b_name, bool log_scale) {
  const int row = 16, label_w = 300, plot_w = 420;
  const int height = 40 + row * static_cast<int>(labels.size());
  double hi = 0;
  for (double v : a) hi = std::max(hi, v);
  for (double v : b) hi = std::max(hi, v);
  const double lo = 1e-12;
  auto scale = [&](double v) -> double {
    if (!(v > 0) || !(hi > 0)) return 0;
    if (!log_scale) return plot_w * v / hi;
    return plot_w * std::max(0.0, std::log10(std::max(v, lo) / lo)) /
           std::max(1e-9, std::log10(std::max(hi, lo * 10) / lo));
  };
  std::string svg = absl::StrFormat(
      "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-size='11' "
      "font-family='monospace'><text x='0' y='14' font-weight='bold'>%s</text>"
      "<rect x='%d' y='20' width='10' height='8' fill='#4a7'/><text x='%d' y='28'>%s</text>",
      label_w + plot_w + 120, height, escape(title), label_w, label_w + 14, escape(a_name));
  if (!b.empty()) {
    absl::StrAppendFormat(&svg,
                          "<rect x='%d' y='20' width='10' height='8' fill='#c84'/>"
                          "<text x='%d' y='28'>%s</text>",
                          label_w + 160, label_w + 174, escape(b_name));
  }
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const int y = 36 + row * static_cast<int>(i);
    absl::StrAppendFormat(&svg, "<text x='0' y='%d'>%s</text>", y + 10, escape(labels[i]));
    const int h = b.empty() ? 12 : 6;
    absl::StrAppendFormat(&svg, "<rect x='%d' y='%d' width='%.1f' height='%d' fill='#4a7'/>",
                          label_w, y, scale(a[i]), h);
    if (!b.empty()) {
      absl::StrAppendFormat(&svg, "<rect x='%d' y='%d' width='%.1f' height='%d' fill='#c84'/>",
                            label_w, y + 6, scale(b[i]), h);
    }
    absl::StrAppendFormat(&svg, "<text x='%d' y='%d'>%.3g%s</text>", label_w + plot_w + 4, y + 10,
                          a[i], b.empty() ? "" : absl::StrFormat(" / %.3g", b[i]));
  }
  return svg + "</svg>";
}

}  // namespace

nlohmann::json to_json(const Report& report) {
  nlohmann::json cases = nlohmann::json::array();
  for (const CaseReport& r : report.cases) {
    nlohmann::json outputs = nlohmann::json::array();
    for (const OutputCheck& o : r.outputs) {
      outputs.push_back({{"name", o.name},
                         {"max_abs", o.max_abs},
                         {"max_rel", o.max_rel},
                         {"tolerance", {{"atol", o.tolerance.atol}, {"rtol", o.tolerance.rtol}}},
                         {"pass", o.pass}});
    }
    cases.push_back({{"id", r.id},
                     {"operation", r.operation},
                     {"dtype", r.dtype},
                     {"status", r.status},
                     {"reason", r.reason},
                     {"adapter", {{"golden", r.golden_adapter}, {"now", r.adapter}}},
                     {"tolerance", {{"atol", r.tolerance.atol}, {"rtol", r.tolerance.rtol}}},
                     {"max_abs", r.max_abs},
                     {"max_rel", r.max_rel},
                     {"deterministic", r.deterministic},
                     {"outputs", outputs},
                     {"forward_ms", {{"golden", r.golden_forward_ms}, {"now", r.forward_ms}}},
                     {"backward_ms", {{"golden", r.golden_backward_ms}, {"now", r.backward_ms}}},
                     {"peak_bytes", {{"golden", r.golden_peak_bytes}, {"now", r.peak_bytes}}}});
  }
  return {{"golden", report.golden},
          {"now",
           {{"keel_version", report.keel_version},
            {"torch_version", report.torch_version},
            {"backend", report.backend},
            {"repeat", report.repeat}}},
          {"summary",
           {{"passed", report.passed},
            {"failed", report.failed},
            {"skipped", report.skipped},
            {"errors", report.errors}}},
          {"cases", cases}};
}

std::string summary_text(const Report& report) {
  std::ostringstream out;
  const auto golden = [&](const char* key) {
    const auto it = report.golden.find(key);
    return it == report.golden.end() ? std::string("?") : it->second;
  };
  out << absl::StrFormat(
      "keel-compat: golden torch %s (keel %s, %s)  ->  now torch %s (keel %s, backend %s)\n",
      golden("torch_version"), golden("keel_version"), golden("backend"), report.torch_version,
      report.keel_version, report.backend);
  out << absl::StrFormat("%-40s %-7s %-15s %10s %10s %5s %9s %9s\n", "case", "status", "adapter",
                         "max_abs", "max_rel", "det", "fwd x", "peak x");
  for (const CaseReport& r : report.cases) {
    out << absl::StrFormat(
        "%-40s %-7s %-15s %10.2e %10.2e %5s %9s %9s\n", r.id, r.status,
        r.golden_adapter + ">" + r.adapter, r.max_abs, r.max_rel, r.deterministic ? "yes" : "NO",
        ratio(r.forward_ms, r.golden_forward_ms),
        ratio(static_cast<double>(r.peak_bytes), static_cast<double>(r.golden_peak_bytes)));
    if (r.status != "pass") out << "    " << r.reason << "\n";
  }
  out << absl::StrFormat(
      "%d passed, %d failed, %d skipped, %d errors (of %d cases, %d runs each)\n", report.passed,
      report.failed, report.skipped, report.errors, static_cast<int>(report.cases.size()),
      report.repeat);
  return out.str();
}

std::string to_html(const Report& report) {
  std::vector<std::string> labels;
  std::vector<double> err, fwd_old, fwd_new, bwd_old, bwd_new, mem_old, mem_new;
  for (const CaseReport& r : report.cases) {
    labels.push_back(r.id);
    err.push_back(r.max_abs);
    fwd_old.push_back(r.golden_forward_ms);
    fwd_new.push_back(r.forward_ms);
    bwd_old.push_back(r.golden_backward_ms);
    bwd_new.push_back(r.backward_ms);
    mem_old.push_back(static_cast<double>(r.golden_peak_bytes) / 1048576.0);
    mem_new.push_back(static_cast<double>(r.peak_bytes) / 1048576.0);
  }
  const auto golden = [&](const char* key) {
    const auto it = report.golden.find(key);
    return escape(it == report.golden.end() ? std::string("?") : it->second);
  };
  std::string html = absl::StrCat(
      "<!doctype html><html><head><meta charset='utf-8'><title>keel-compat report</title><style>"
      "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
      "td,th{border:1px solid #ccc;padding:2px "
      "6px}.pass{background:#dfd}.fail,.error{background:#fdd}"
      ".skipped{background:#eee}</style></head><body><h1>keel-compat: upgrade report</h1>",
      "<p>Golden: torch ", golden("torch_version"), ", keel ", golden("keel_version"), ", backend ",
      golden("backend"), ". Now: torch ", escape(report.torch_version), ", keel ",
      escape(report.keel_version), ", backend ", escape(report.backend), ", ", report.repeat,
      " runs per case.</p>",
      absl::StrFormat("<p><b>%d passed, %d failed, %d skipped, %d errors</b></p>", report.passed,
                      report.failed, report.skipped, report.errors));
  html += bars("max abs error per case (log scale)", labels, err, {}, "max abs error", "", true);
  html +=
      "<br>" + bars("forward ms: golden vs now", labels, fwd_old, fwd_new, "golden", "now", false);
  html +=
      "<br>" + bars("backward ms: golden vs now", labels, bwd_old, bwd_new, "golden", "now", false);
  html +=
      "<br>" + bars("peak MiB: golden vs now", labels, mem_old, mem_new, "golden", "now", false);
  html +=
      "<h2>Cases</h2><table><tr><th>case</th><th>status</th><th>adapter golden/now</th><th>max "
      "abs</th>"
      "<th>max rel</th><th>atol/rtol</th><th>deterministic</th><th>fwd ms golden/now</th>"
      "<th>bwd ms golden/now</th><th>peak MiB golden/now</th><th>reason</th></tr>";
  for (const CaseReport& r : report.cases) {
    absl::StrAppendFormat(
        &html,
        "<tr class='%s'><td>%s</td><td>%s</td><td>%s / %s</td><td>%.2e</td><td>%.2e</td>"
        "<td>%.0e / %.0e</td><td>%s</td><td>%.3f / %.3f</td><td>%.3f / %.3f</td><td>%s / %s</td>"
        "<td>%s</td></tr>",
        r.status, escape(r.id), r.status, escape(r.golden_adapter), escape(r.adapter), r.max_abs,
        r.max_rel, r.tolerance.atol, r.tolerance.rtol, r.deterministic ? "yes" : "NO",
        r.golden_forward_ms, r.forward_ms, r.golden_backward_ms, r.backward_ms,
        mib(r.golden_peak_bytes), mib(r.peak_bytes), escape(r.reason));
  }
  return html + "</table></body></html>\n";
}

// --- diff ------------------------------------------------------------------

namespace {

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

std::string tensor_text(const std::string& dtype, const std::vector<std::int64_t>& shape) {
  return dtype.empty() ? "-" : dtype + " " + shape_text(shape);
}

std::string worst_text(const WorstElement& w, bool exact) {
  if (exact) {
    return absl::StrFormat("%s: %d vs %d (integers must match exactly)", shape_text(w.index),
                           w.a_int, w.b_int);
  }
  return absl::StrFormat("%s: %.9g vs %.9g (|diff| %.3g)", shape_text(w.index), w.a, w.b,
                         w.abs_diff);
}

}  // namespace

nlohmann::json to_json(const DiffReport& report) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorDiff& d : report.tensors) {
    nlohmann::json worst = nlohmann::json::array();
    for (const WorstElement& w : d.values.worst) {
      if (d.values.exact) {
        worst.push_back(
            {{"index", w.index}, {"a", w.a_int}, {"b", w.b_int}, {"abs_diff", w.abs_diff}});
      } else {
        worst.push_back({{"index", w.index}, {"a", w.a}, {"b", w.b}, {"abs_diff", w.abs_diff}});
      }
    }
    tensors.push_back({{"name", d.name},
                       {"status", d.status},
                       {"a", {{"dtype", d.a_dtype}, {"shape", d.a_shape}}},
                       {"b", {{"dtype", d.b_dtype}, {"shape", d.b_shape}}},
                       {"atol", d.tolerance.atol},
                       {"rtol", d.tolerance.rtol},
                       {"tolerance_from", d.tolerance_from},
                       {"max_abs", d.values.max_abs},
                       {"max_rel", d.values.max_rel},
                       {"mismatched", d.values.mismatched},
                       {"nonfinite_mismatch", d.values.nonfinite_mismatch},
                       {"worst", worst}});
  }
  return {{"a", report.a},
          {"b", report.b},
          {"passed", report.passed},
          {"failed", report.failed},
          {"missing", report.missing},
          {"extra", report.extra},
          {"mismatched", report.mismatched},
          {"tensors", tensors}};
}

std::string summary_text(const DiffReport& report) {
  std::string s;
  for (const TensorDiff& d : report.tensors) {
    if (d.status == "pass") continue;
    absl::StrAppendFormat(&s, "%-7s %s: A %s, B %s", d.status, d.name,
                          tensor_text(d.a_dtype, d.a_shape), tensor_text(d.b_dtype, d.b_shape));
    if (d.status == "fail" || d.status == "dtype") {
      absl::StrAppendFormat(&s, "; max abs %.3g, max rel %.3g, %d beyond atol %.0e rtol %.0e (%s)",
                            d.values.max_abs, d.values.max_rel, d.values.mismatched,
                            d.tolerance.atol, d.tolerance.rtol, d.tolerance_from);
      if (d.values.nonfinite_mismatch > 0) {
        absl::StrAppendFormat(&s, ", %d NaN/inf placed differently", d.values.nonfinite_mismatch);
      }
      for (const WorstElement& w : d.values.worst)
        absl::StrAppend(&s, "\n          ", worst_text(w, d.values.exact));
    }
    s += "\n";
  }
  absl::StrAppendFormat(&s,
                        "keel-compat diff: %d tensors pass, %d fail, %d only in A, %d only in B, "
                        "%d differ in shape or dtype\n",
                        report.passed, report.failed, report.missing, report.extra,
                        report.mismatched);
  return s;
}

std::string to_html(const DiffReport& report) {
  std::vector<std::string> labels;
  std::vector<double> err;
  for (const TensorDiff& d : report.tensors) {
    if (d.status != "pass" && d.status != "fail" && d.status != "dtype") continue;
    if (!std::isfinite(d.values.max_abs)) continue;  // in the table, not on the scale
    labels.push_back(d.name);
    err.push_back(d.values.max_abs);
  }
  std::string html = absl::StrCat(
      "<!doctype html><html><head><meta charset='utf-8'><title>keel-compat diff</title><style>"
      "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
      "td,th{border:1px solid #ccc;padding:2px 6px}.pass{background:#dfd}"
      ".fail,.shape,.dtype,.missing,.extra{background:#fdd}</style></head><body>"
      "<h1>keel-compat diff</h1><p>A: ",
      escape(report.a), "<br>B: ", escape(report.b), "</p>",
      absl::StrFormat("<p><b>%d pass, %d fail, %d only in A, %d only in B, %d differ in shape or "
                      "dtype</b></p>",
                      report.passed, report.failed, report.missing, report.extra,
                      report.mismatched));
  if (!labels.empty()) {
    html += bars("max abs difference per tensor (log scale)", labels, err, {}, "max abs", "", true);
  }
  html +=
      "<h2>Tensors</h2><table><tr><th>tensor</th><th>status</th><th>A</th><th>B</th><th>max "
      "abs</th><th>max rel</th><th>beyond</th><th>NaN/inf misplaced</th><th>atol/rtol</th>"
      "<th>worst elements</th></tr>";
  for (const TensorDiff& d : report.tensors) {
    std::string worst;
    for (const WorstElement& w : d.values.worst)
      absl::StrAppend(&worst, escape(worst_text(w, d.values.exact)), "<br>");
    absl::StrAppendFormat(&html,
                          "<tr class='%s'><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%.2e</td>"
                          "<td>%.2e</td><td>%d</td><td>%d</td><td>%.0e / %.0e (%s)</td><td>%s</td>"
                          "</tr>",
                          d.status, escape(d.name), d.status,
                          escape(tensor_text(d.a_dtype, d.a_shape)),
                          escape(tensor_text(d.b_dtype, d.b_shape)), d.values.max_abs,
                          d.values.max_rel, d.values.mismatched, d.values.nonfinite_mismatch,
                          d.tolerance.atol, d.tolerance.rtol, escape(d.tolerance_from), worst);
  }
  return html + "</table></body></html>\n";
}

}  // namespace keel::harness
