// keel-compat's canonical suite: families of cases, one family per keel
// operation. A family makes its cases (inputs drawn once, at record time,
// from a fixed seed) and runs one case on a chosen backend, forward and
// backward. Inputs are stored, never regenerated: torch's random streams
// are not promised equal across releases, so a seed is not a stable input.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "keel/v1/comm.h"
#include "keel/v1/compat.h"
#include "keel/v1/dispatch.h"
#include "keel/v1/error.h"

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

class Family {
 public:
  virtual ~Family() = default;
  virtual std::string operation() const = 0;
  virtual std::vector<Case> make_cases() const = 0;
  virtual result<Run> run(const Case& c, Backend backend) const = 0;
  // One rank's part of a case that runs on a group of ranks
  // (harness/rank_workers.h): `c` holds this rank's inputs; the Run's
  // outputs and adapter go back to the parent. Families without such cases
  // keep the default, a corrupt_data error.
  virtual result<Run> run_rank(comm::Communicator& group, const Case& c, Backend backend) const;
};

// Every family this build knows, in suite order.
const std::vector<std::unique_ptr<Family>>& families();
const Family* find_family(const std::string& operation);

// Whether `id` passes `filter`: empty, or any comma-separated part is a
// substring of `id`.
bool matches_filter(const std::string& id, const std::string& filter);

std::unique_ptr<Family> make_logsumexp_family();
std::unique_ptr<Family> make_attention_family();
std::unique_ptr<Family> make_loss_family();
std::unique_ptr<Family> make_comm_family();

}  // namespace keel::harness
