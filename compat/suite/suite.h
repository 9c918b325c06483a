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

#include "engine/case.h"
#include "keel/v1/comm.h"
#include "keel/v1/compat.h"
#include "keel/v1/dispatch.h"
#include "keel/v1/error.h"
#include "keel/v1/loss.h"

namespace keel::harness {

class Family {
 public:
  virtual ~Family() = default;
  virtual std::string operation() const = 0;
  virtual std::vector<Case> make_cases() const = 0;
  virtual result<Run> run(const Case& c, Backend backend) const = 0;
  // One rank's part of a case that runs on a group of ranks
  // (suite/rank_workers.h): `c` holds this rank's inputs; the Run's
  // outputs and adapter go back to the parent. Families without such cases
  // keep the default, a corrupt_data error.
  virtual result<Run> run_rank(comm::Communicator& group, const Case& c, Backend backend) const;
};

// Every family this build knows, in suite order.
const std::vector<std::unique_ptr<Family>>& families();
const Family* find_family(const std::string& operation);

// A loss case's stored options (reduction, label smoothing, z-loss, logit
// softcap, chunk size) and class weights as the call's options; the family
// runs with them, and a test's reference reads them from here too.
LinearCrossEntropyOptions loss_options_of(const Case& c);

std::unique_ptr<Family> make_logsumexp_family();
std::unique_ptr<Family> make_attention_family();
std::unique_ptr<Family> make_loss_family();
std::unique_ptr<Family> make_comm_family();

}  // namespace keel::harness
