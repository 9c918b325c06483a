// The fused loss family: the option matrix (reductions, ignore_index,
// smoothing, class weights, z-loss, softcap, bias), fp32 and bf16; the loss
// and the gradients of hidden, weight and bias.
#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <torch/csrc/autograd/autograd.h>

#include "harness/peak_memory.h"
#include "harness/suite.h"
#include "keel/v1/loss.h"

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
};

}  // namespace

std::unique_ptr<Family> make_loss_family() {
  return std::make_unique<LossFamily>();
}

}  // namespace keel::harness
