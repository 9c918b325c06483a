// The fused loss family: the option matrix (reductions, ignore_index,
// smoothing, class weights, z-loss, softcap, bias), fp32 and bf16; the loss
// and the gradients of hidden, weight and bias. The vocabulary-parallel
// cases store the whole weight and a split of its classes across 2 or 3
// ranks (options "shards": each rank's [first class, classes]); a run
// starts the ranks (suite/rank_workers.h), each with its slice, and its
// outputs are those of the unsharded call: the loss and grad_hidden of
// rank 0 (which every rank must match bitwise) and the ranks' grad_weight
// and grad_bias slices put back in class order.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <absl/strings/str_cat.h>
#include <torch/csrc/autograd/autograd.h>

#include "engine/peak_memory.h"
#include "keel/v1/loss.h"
#include "suite/rank_workers.h"
#include "suite/suite.h"

namespace keel::harness {
namespace {

class LossFamily final : public Family {
 public:
  std::string operation() const override { return "linear_cross_entropy"; }

  std::vector<Case> make_cases() const override {
    std::vector<Case> cases;
    at::manual_seed(20261204);
    const std::int64_t n = 256, d = 64, v = 1000;
    struct Spec {
      const char* name;
      nlohmann::json options;
    };
    const Spec specs[] = {
        {"mean", {{"reduction", "mean"}}},
        {"sum", {{"reduction", "sum"}}},
        {"none", {{"reduction", "none"}}},
        {"mean_ignore_index", {{"reduction", "mean"}, {"ignore", true}}},
        {"mean_smoothing_weights",
         {{"reduction", "mean"},
          {"label_smoothing", 0.1},
          {"class_weights", true},
          {"ignore", true}}},
        {"sum_z_loss_softcap_bias",
         {{"reduction", "sum"}, {"z_loss", 1e-4}, {"logit_softcap", 30.0}, {"bias", true}}},
        {"small_chunks", {{"reduction", "mean"}, {"chunk_size", 37}}},
        {"vocab_parallel_2_mean_smoothing_weights",
         {{"reduction", "mean"},
          {"label_smoothing", 0.1},
          {"class_weights", true},
          {"ignore", true},
          {"shards", {{0, 600}, {600, 400}}}}},
        {"vocab_parallel_3_sum_z_loss_softcap_bias",
         {{"reduction", "sum"},
          {"z_loss", 1e-4},
          {"logit_softcap", 30.0},
          {"bias", true},
          {"chunk_size", 37},
          {"shards", {{700, 300}, {0, 250}, {250, 450}}}}},
        {"vocab_parallel_2_none", {{"reduction", "none"}, {"shards", {{500, 500}, {0, 500}}}}},
    };
    for (const auto& [type, dtype] :
         {std::pair{at::kFloat, "float32"}, std::pair{at::kBFloat16, "bfloat16"}}) {
      for (const Spec& s : specs) {
        Case c;
        c.id = absl::StrCat("linear_cross_entropy/", dtype, "/", s.name);
        c.operation = operation();
        c.dtype = dtype;
        c.options = s.options;
        c.inputs["hidden"] = at::randn({n, d}).to(type);
        c.inputs["weight"] = (at::randn({v, d}) * 0.1).to(type);
        at::Tensor target = at::randint(0, v, {n}, at::kLong);
        if (s.options.value("ignore", false)) target.masked_fill_(at::rand({n}) < 0.2, -100);
        c.inputs["target"] = target;
        if (s.options.value("class_weights", false))
          c.inputs["class_weights"] = at::rand({v}) + 0.5;
        if (s.options.value("bias", false)) c.inputs["bias"] = (at::randn({v}) * 0.1).to(type);
        if (s.options.value("reduction", "mean") == "none") c.inputs["upstream"] = at::randn({n});
        cases.push_back(std::move(c));
      }
    }
    return cases;
  }

  result<Run> run(const Case& c, Backend backend) const override {
    if (c.options.contains("shards")) return run_sharded(c, backend);
    return run_loss(c, backend, std::nullopt, 0);
  }

  result<Run> run_rank(comm::Communicator& group, const Case& c, Backend backend) const override {
    auto shards = shards_of(c, -1);
    if (!shards) return shards.error();
    if (static_cast<std::size_t>(group.size()) != shards.value().size()) {
      return Error(Errc::corrupt_data,
                   absl::StrCat("linear_cross_entropy: case ", c.id, " has ", shards.value().size(),
                                " shards for ", group.size(), " ranks"));
    }
    // keel checks the slice against the other ranks' (the shards must tile
    // the vocabulary); the rank's own weight rows are its shard's size.
    // The ranks share the machine: each runs on one intra-op thread, so
    // that the BLAS never picks its thread count by load and a repeat is
    // bitwise the same (a 3-rank case on 2 cores was not).
    at::set_num_threads(1);
    return run_loss(c, backend, group, shards.value()[group.rank()].first);
  }

 private:
  // The call on this process's inputs; with `group`, the rank's part of a
  // vocabulary-parallel call whose weight slice starts at `vocab_start`.
  static result<Run> run_loss(const Case& c, Backend backend,
                              const std::optional<comm::Communicator>& group,
                              std::int64_t vocab_start) {
    LinearCrossEntropyOptions o = loss_options_of(c);
    o.vocab_parallel.communicator = group;
    o.vocab_parallel.vocab_start = vocab_start;
    o.dispatch.backend = backend;
    const at::Tensor hidden = c.inputs.at("hidden").detach().clone().requires_grad_(true);
    const at::Tensor weight = c.inputs.at("weight").detach().clone().requires_grad_(true);
    std::vector<at::Tensor> wrt{hidden, weight};
    if (auto b = c.inputs.find("bias"); b != c.inputs.end()) {
      o.bias = b->second.detach().clone().requires_grad_(true);
      wrt.push_back(o.bias);
    }
    Run run;
    PeakMemory memory;
    auto start = std::chrono::steady_clock::now();
    result<LossOutput> out = linear_cross_entropy(hidden, weight, c.inputs.at("target"), o);
    run.forward_ms = elapsed_ms(start);
    if (!out) return out.error();
    run.adapter = out.value().dispatch.adapter;
    const at::Tensor loss = out.value().loss;
    const at::Tensor upstream = c.inputs.count("upstream") != 0u
                                    ? c.inputs.at("upstream").to(loss.scalar_type())
                                    : at::ones_like(loss);
    start = std::chrono::steady_clock::now();
    const auto grads = torch::autograd::grad({loss}, wrt, {upstream});
    run.backward_ms = elapsed_ms(start);
    run.peak_bytes = memory.peak_bytes();
    run.outputs["loss"] = loss.detach();
    run.outputs["grad_hidden"] = grads[0];
    run.outputs["grad_weight"] = grads[1];
    if (grads.size() > 2) run.outputs["grad_bias"] = grads[2];
    return run;
  }

  // Each rank's [first class, classes], checked against the whole weight's
  // `classes` where it is known (a file is not trusted to slice by).
  static result<std::vector<std::pair<std::int64_t, std::int64_t>>> shards_of(
      const Case& c, std::int64_t classes) {
    const nlohmann::json& spec = c.options.at("shards");
    std::vector<std::pair<std::int64_t, std::int64_t>> shards;
    const auto bad = [&] {
      return Error(
          Errc::corrupt_data,
          absl::StrCat("linear_cross_entropy: case ", c.id, ": options.shards ", spec.dump(),
                       " is not a list of 1 to 8 [first class, classes] pairs within "
                       "the stored weight's classes"));
    };
    if (!spec.is_array() || spec.empty() || spec.size() > 8) return bad();
    for (const nlohmann::json& s : spec) {
      if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer() ||
          !s[1].is_number_integer()) {
        return bad();
      }
      const auto start = s[0].get<std::int64_t>();
      const auto size = s[1].get<std::int64_t>();
      if (start < 0 || size < 1 || (classes >= 0 && (start > classes || size > classes - start))) {
        return bad();
      }
      shards.emplace_back(start, size);
    }
    return shards;
  }

  result<Run> run_sharded(const Case& c, Backend backend) const {
    for (const char* name : {"hidden", "weight", "target"}) {
      if (c.inputs.count(name) == 0) {
        return Error(Errc::corrupt_data, absl::StrCat("linear_cross_entropy: case ", c.id,
                                                      " has no stored input '", name, "'"));
      }
    }
    const at::Tensor& whole = c.inputs.at("weight");
    if (whole.dim() != 2) {
      return Error(Errc::corrupt_data,
                   absl::StrCat("linear_cross_entropy: case ", c.id, ": stored weight is not 2-D"));
    }
    auto shards = shards_of(c, whole.size(0));
    if (!shards) return shards.error();
    std::vector<std::map<std::string, at::Tensor>> inputs;
    for (const auto& [start, size] : shards.value()) {
      std::map<std::string, at::Tensor> in = c.inputs;
      in["weight"] = whole.narrow(0, start, size);
      for (const char* name : {"class_weights", "bias"}) {
        if (auto t = in.find(name); t != in.end()) {
          if (t->second.dim() != 1 || t->second.size(0) < start + size) {
            return Error(Errc::corrupt_data,
                         absl::StrCat("linear_cross_entropy: case ", c.id, ": stored '", name,
                                      "' does not cover the weight's classes"));
          }
          t->second = t->second.narrow(0, start, size);
        }
      }
      inputs.push_back(std::move(in));
    }
    // Each rank finds its first class in "shards" by its rank.
    result<std::vector<RankRun>> ran = run_on_ranks(c, inputs, backend);
    if (!ran) return ran.error();
    const std::vector<RankRun>& runs = ran.value();
    const auto ranks = static_cast<std::int64_t>(runs.size());
    Run run;
    run.adapter = runs[0].adapter;
    for (std::int64_t r = 0; r < ranks; ++r) {
      for (const char* name : {"loss", "grad_hidden", "grad_weight"}) {
        if (runs[r].outputs.count(name) == 0) {
          return Error(Errc::corrupt_data, absl::StrCat("linear_cross_entropy: case ", c.id,
                                                        ": rank ", r, " wrote no ", name));
        }
      }
      for (const char* name : {"loss", "grad_hidden"}) {
        if (!at::equal(runs[r].outputs.at(name), runs[0].outputs.at(name))) {
          return Error(Errc::backend_error,
                       absl::StrCat("linear_cross_entropy: case ", c.id, ": rank ", r, "'s ", name,
                                    " differs from rank 0's; every rank of a "
                                    "vocabulary-parallel call must get the same"));
        }
      }
      run.forward_ms = std::max(run.forward_ms, runs[r].ms);
      run.peak_bytes = std::max(run.peak_bytes, runs[r].peak_bytes);
    }
    run.outputs["loss"] = runs[0].outputs.at("loss");
    run.outputs["grad_hidden"] = runs[0].outputs.at("grad_hidden");
    // The slices back in class order.
    std::vector<std::int64_t> order(static_cast<std::size_t>(ranks));
    for (std::int64_t r = 0; r < ranks; ++r) order[r] = r;
    std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      return shards.value()[a].first < shards.value()[b].first;
    });
    for (const char* name : {"grad_weight", "grad_bias"}) {
      std::vector<at::Tensor> parts;
      for (std::int64_t r : order) {
        if (auto t = runs[r].outputs.find(name); t != runs[r].outputs.end()) {
          parts.push_back(t->second);
        }
      }
      if (!parts.empty()) run.outputs[name] = at::cat(parts);
    }
    return run;
  }
};

}  // namespace

LinearCrossEntropyOptions loss_options_of(const Case& c) {
  LinearCrossEntropyOptions o;
  const std::string reduction = c.options.value("reduction", "mean");
  o.reduction = reduction == "sum"    ? Reduction::sum
                : reduction == "none" ? Reduction::none
                                      : Reduction::mean;
  o.label_smoothing = c.options.value("label_smoothing", 0.0);
  o.z_loss = c.options.value("z_loss", 0.0);
  o.logit_softcap = c.options.value("logit_softcap", 0.0);
  o.chunk_size = c.options.value("chunk_size", std::int64_t{0});
  if (auto w = c.inputs.find("class_weights"); w != c.inputs.end()) o.class_weights = w->second;
  return o;
}

std::unique_ptr<Family> make_loss_family() {
  return std::make_unique<LossFamily>();
}

}  // namespace keel::harness
