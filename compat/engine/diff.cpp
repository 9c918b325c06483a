#include "diff.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>

#include "keel/v1/dtype.h"
#include "safetensors.h"

namespace keel::harness {
namespace {

std::vector<std::int64_t> shape_of(const at::Tensor& t) {
  return {t.sizes().begin(), t.sizes().end()};
}

std::vector<std::int64_t> unravel(std::int64_t flat, at::IntArrayRef sizes) {
  std::vector<std::int64_t> index(sizes.size());
  for (std::size_t d = sizes.size(); d-- > 0;) {
    index[d] = sizes[d] == 0 ? 0 : flat % sizes[d];
    flat = sizes[d] == 0 ? 0 : flat / sizes[d];
  }
  return index;
}

using Policy = std::map<std::string, Tolerance>;

result<Policy> read_policy(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Error(Errc::io_error, absl::StrCat("diff: cannot read policy file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const auto bad = [&](const std::string& why) {
    return Error(Errc::invalid_argument, absl::StrCat("diff: policy file '", path, "': ", why));
  };
  if (!j.is_object()) {
    return bad(R"(expected a JSON object of tensor name -> {"atol": x, "rtol": y})");
  }
  Policy policy;
  for (const auto& [name, entry] : j.items()) {
    if (!entry.is_object() || !entry.contains("atol") || !entry.contains("rtol") ||
        !entry["atol"].is_number() || !entry["rtol"].is_number()) {
      return bad(absl::StrCat("'", name, R"(': expected {"atol": number, "rtol": number})"));
    }
    const Tolerance tol{entry["atol"].get<double>(), entry["rtol"].get<double>()};
    if (!(tol.atol >= 0) || !(tol.rtol >= 0)) {
      return bad(absl::StrCat("'", name, "': atol and rtol must be >= 0"));
    }
    policy[name] = tol;
  }
  return policy;
}

// The tolerance of tensor `name`: the policy file's exact name, else its
// longest matching "prefix*", else --atol/--rtol, else the dtype policy.
std::pair<Tolerance, std::string> tolerance_of(const std::string& name, const at::Tensor& a,
                                               const DiffOptions& options, const Policy& policy) {
  if (const auto it = policy.find(name); it != policy.end()) {
    return {it->second, "policy file: " + name};
  }
  const std::string* best = nullptr;
  for (const auto& [key, tol] : policy) {
    if (!absl::EndsWith(key, "*")) continue;
    const std::string prefix = key.substr(0, key.size() - 1);
    if (absl::StartsWith(name, prefix) && (best == nullptr || key.size() > best->size())) {
      best = &key;
    }
  }
  if (best != nullptr) return {policy.at(*best), "policy file: " + *best};
  if (options.atol) return {{*options.atol, *options.rtol}, "--atol/--rtol"};
  const std::string dtype = keel::dtype_name(a);
  return {tolerance_for(dtype), "policy (" + dtype + ")"};
}

}  // namespace

bool is_exact_dtype(at::ScalarType type) {
  return !at::isFloatingType(type) && !at::isComplexType(type);
}

namespace {

// Integer and boolean tensors: equal or not, whatever the tolerance. Compared
// in int64 (every integer dtype keel writes fits), never through float64,
// which cannot tell 2^53 + 1 from 2^53. The worst elements are the first
// mismatches in index order.
ValueCheck check_exact(const at::Tensor& a, const at::Tensor& b, int worst) {
  ValueCheck check;
  check.exact = true;
  const at::Tensor w = a.to(at::kLong).reshape({-1});
  const at::Tensor g = b.to(at::kLong).reshape({-1});
  const at::Tensor mismatch = w.ne(g);
  check.mismatched = mismatch.sum().item<std::int64_t>();
  check.pass = check.mismatched == 0;
  if (check.pass) return check;
  const at::Tensor diff = (g.to(at::kDouble) - w.to(at::kDouble)).abs();
  check.max_abs = diff.max().item<double>();
  check.max_rel = (diff / w.to(at::kDouble).abs().clamp_min(1)).max().item<double>();
  const at::Tensor where = mismatch.nonzero().reshape({-1});
  const auto k = std::min<std::int64_t>(worst, where.numel());
  for (std::int64_t i = 0; i < k; ++i) {
    const auto flat = where[i].item<std::int64_t>();
    const auto want = w[flat].item<std::int64_t>();
    const auto got = g[flat].item<std::int64_t>();
    check.worst.push_back({unravel(flat, a.sizes()), static_cast<double>(want),
                           static_cast<double>(got), diff[flat].item<double>(), want, got});
  }
  return check;
}

}  // namespace

ValueCheck check_values(const at::Tensor& a, const at::Tensor& b, const Tolerance& tol, int worst) {
  if (is_exact_dtype(a.scalar_type()) || is_exact_dtype(b.scalar_type())) {
    return check_exact(a, b, worst);
  }
  ValueCheck check;
  const at::Tensor w = a.to(at::kDouble);
  const at::Tensor g = b.to(at::kDouble);
  if (w.numel() == 0) return check;
  const at::Tensor same_special = (g.isnan() & w.isnan()) | ((g == w) & w.isinf());
  const at::Tensor diff = at::where(same_special, at::zeros_like(g), (g - w).abs());
  const at::Tensor bad_special =
      (g.isfinite().logical_not() | w.isfinite().logical_not()) & same_special.logical_not();
  const at::Tensor rel = diff / w.abs().clamp_min(std::numeric_limits<double>::min());
  const at::Tensor over = bad_special | (diff > tol.atol + tol.rtol * w.abs().nan_to_num(0, 0, 0));
  check.nonfinite_mismatch = bad_special.sum().item<std::int64_t>();
  check.mismatched = over.sum().item<std::int64_t>();
  check.max_abs = check.nonfinite_mismatch > 0 ? std::numeric_limits<double>::infinity()
                                               : diff.max().item<double>();
  check.max_rel = check.nonfinite_mismatch > 0 ? std::numeric_limits<double>::infinity()
                  : check.max_abs == 0         ? 0
                                               : rel.max().item<double>();
  check.pass = check.mismatched == 0;
  if (worst > 0) {
    // Non-finite mismatches first (as +inf), then the largest differences.
    const at::Tensor score =
        at::where(bad_special, at::full_like(diff, std::numeric_limits<double>::infinity()), diff)
            .reshape({-1});
    const auto k = std::min<std::int64_t>(worst, score.numel());
    const at::Tensor top = std::get<1>(score.topk(k));
    const at::Tensor wf = w.reshape({-1});
    const at::Tensor gf = g.reshape({-1});
    for (std::int64_t i = 0; i < k; ++i) {
      const auto flat = top[i].item<std::int64_t>();
      const auto d = score[flat].item<double>();
      if (d == 0) break;
      check.worst.push_back(
          {unravel(flat, w.sizes()), wf[flat].item<double>(), gf[flat].item<double>(), d});
    }
  }
  return check;
}

result<DiffReport> diff(const DiffOptions& options) {
  if (options.atol.has_value() != options.rtol.has_value()) {
    return Error(Errc::invalid_argument, "diff: give --atol and --rtol together, or neither");
  }
  if (options.atol && (!(*options.atol >= 0) || !(*options.rtol >= 0))) {
    return Error(Errc::invalid_argument, "diff: --atol and --rtol must be >= 0");
  }
  Policy policy;
  if (!options.policy_file.empty()) {
    result<Policy> read = read_policy(options.policy_file);
    if (!read) return read.error();
    policy = std::move(read).value();
  }
  result<TensorFile> a = read_safetensors(options.a);
  if (!a) return a.error();
  result<TensorFile> b = read_safetensors(options.b);
  if (!b) return b.error();
  const auto& at_a = a.value().tensors;
  const auto& at_b = b.value().tensors;

  DiffReport report;
  report.a = options.a;
  report.b = options.b;
  std::set<std::string> names;
  for (const auto& entry : at_a) names.insert(entry.first);
  for (const auto& entry : at_b) names.insert(entry.first);
  for (const std::string& name : names) {
    TensorDiff d;
    d.name = name;
    const auto ia = at_a.find(name);
    const auto ib = at_b.find(name);
    if (ia != at_a.end()) {
      d.a_dtype = keel::dtype_name(ia->second);
      d.a_shape = shape_of(ia->second);
    }
    if (ib != at_b.end()) {
      d.b_dtype = keel::dtype_name(ib->second);
      d.b_shape = shape_of(ib->second);
    }
    if (ib == at_b.end()) {
      d.status = "missing";
      ++report.missing;
    } else if (ia == at_a.end()) {
      d.status = "extra";
      ++report.extra;
    } else if (d.a_shape != d.b_shape) {
      d.status = "shape";
      ++report.mismatched;
    } else {
      std::tie(d.tolerance, d.tolerance_from) = tolerance_of(name, ia->second, options, policy);
      d.values = check_values(ia->second, ib->second, d.tolerance, /*worst=*/5);
      if (d.a_dtype != d.b_dtype) {
        d.status = "dtype";
        ++report.mismatched;
      } else if (d.values.pass) {
        d.status = "pass";
        ++report.passed;
      } else {
        d.status = "fail";
        ++report.failed;
      }
    }
    report.tensors.push_back(std::move(d));
  }
  return report;
}

}  // namespace keel::harness
