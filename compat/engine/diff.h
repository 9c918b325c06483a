// keel-compat diff: two safetensors files written by anyone (keel-compat,
// Python's safetensors.torch.save_file or safetensors.numpy), compared
// tensor by tensor under the documented tolerance policy (docs/compat.md),
// a global --atol/--rtol, or a per-tensor policy file. The values are
// judged by the same element check as `compare` (check_values below).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "case.h"
#include "keel/v1/error.h"

namespace keel::harness {

// One element among the worst: its index, the two values and |a - b|.
struct WorstElement {
  std::vector<std::int64_t> index;
  double a = 0, b = 0, abs_diff = 0;
  // The two values as integers, for an exact (integer or boolean) check:
  // float64 cannot hold every int64.
  std::int64_t a_int = 0, b_int = 0;
};

// How `b` compares with `a` (the reference) element by element, in
// float64: |b - a| against atol + rtol * |a|. NaN matches NaN, an infinity
// the same infinity; any other placement of a non-finite value fails.
// Integer and boolean tensors are compared exactly, whatever the tolerance
// (docs/compat.md): `exact` says so, and `worst` holds the first mismatches.
struct ValueCheck {
  bool exact = false;
  double max_abs = 0;
  double max_rel = 0;
  std::int64_t mismatched = 0;          // elements beyond the tolerance
  std::int64_t nonfinite_mismatch = 0;  // a NaN or inf that the other file does not match
  std::vector<WorstElement> worst;      // the largest differences, worst first
  bool pass = true;
};

// Whether outputs of this dtype must match exactly (integers, bool).
bool is_exact_dtype(at::ScalarType type);

// `b` against `a` (same shape), keeping the `worst` largest differences.
ValueCheck check_values(const at::Tensor& a, const at::Tensor& b, const Tolerance& tol,
                        int worst = 0);

struct TensorDiff {
  std::string name;
  // "pass", "fail" (values beyond the tolerance), "missing" (only in A),
  // "extra" (only in B), "shape", "dtype".
  std::string status;
  std::string a_dtype, b_dtype;
  std::vector<std::int64_t> a_shape, b_shape;
  Tolerance tolerance;
  std::string tolerance_from;  // "policy (float32)", "--atol/--rtol", "policy file: name"
  ValueCheck values;           // when both hold it with the same shape
};

struct DiffReport {
  std::string a, b;  // the paths
  std::vector<TensorDiff> tensors;
  int passed = 0, failed = 0, missing = 0, extra = 0, mismatched = 0;  // shape or dtype
  bool ok() const { return failed == 0 && missing == 0 && extra == 0 && mismatched == 0; }
};

struct DiffOptions {
  std::string a, b;
  std::optional<double> atol, rtol;  // both or neither: every tensor's tolerance
  // A JSON object: tensor name -> {"atol": x, "rtol": y}; a name ending in
  // '*' matches every tensor it prefixes (the longest such prefix wins).
  std::string policy_file;
};

// `invalid_argument` for bad options or policy file; `io_error` or
// `corrupt_data` when a file cannot be read.
result<DiffReport> diff(const DiffOptions& options);

nlohmann::json to_json(const DiffReport& report);
std::string summary_text(const DiffReport& report);
std::string to_html(const DiffReport& report);

}  // namespace keel::harness
