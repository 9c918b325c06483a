// The golden-file engine's case and run: what a case stores (its inputs,
// options and tolerance) and what one run of it gives. The engine (record,
// compare, diff, the reports, the public keel::compat) and keel-compat's
// suite of case families both speak them.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "keel/v1/compat.h"

namespace keel::harness {

// Absolute and relative tolerance, |got - want| <= atol + rtol * |want|:
// the public type, so that keel::compat passes it through unchanged.
using Tolerance = compat::Tolerance;

struct Case {
  std::string id;         // "logsumexp/float32/masked"
  std::string operation;  // the family: "logsumexp"
  std::string dtype;      // the inputs' floating dtype: "float32", "bfloat16", ...
  nlohmann::json options = nlohmann::json::object();  // the family's own
  std::map<std::string, at::Tensor> inputs;
  // Set by a family whose case is worse conditioned than the dtype policy
  // assumes; recorded in the file, and what compare judges by.
  std::optional<Tolerance> tolerance;
  // Per output, overriding `tolerance` for the outputs it names.
  std::map<std::string, Tolerance> output_tolerances;
};

// The documented policy (docs/compat.md), by the case's input dtype.
Tolerance tolerance_for(const std::string& dtype);

struct Run {
  std::map<std::string, at::Tensor> outputs;  // forward outputs and gradients
  std::string adapter;                        // DispatchInfo::adapter
  double forward_ms = 0;
  double backward_ms = 0;
  std::int64_t peak_bytes = 0;  // peak CPU tensor memory of forward + backward
};

// Milliseconds since `start`, for a Run's timings.
inline double elapsed_ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// Whether `id` passes `filter`: empty, or any comma-separated part is a
// substring of `id`.
bool matches_filter(const std::string& id, const std::string& filter);

}  // namespace keel::harness
