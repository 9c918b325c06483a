// The logsumexp family: every dtype, reduction dims, keepdim, masks with
// empty rows, and large magnitudes; forward and the input's gradient.
#include <algorithm>

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <torch/csrc/autograd/autograd.h>

#include "engine/peak_memory.h"
#include "keel/v1/logsumexp.h"
#include "suite/suite.h"

namespace keel::harness {
namespace {

class LogsumexpFamily final : public Family {
 public:
  std::string operation() const override { return "logsumexp"; }

  std::vector<Case> make_cases() const override {
    std::vector<Case> cases;
    at::manual_seed(20261202);
    const std::pair<at::ScalarType, const char*> dtypes[] = {{at::kFloat, "float32"},
                                                             {at::kBFloat16, "bfloat16"},
                                                             {at::kHalf, "float16"},
                                                             {at::kDouble, "float64"}};
    for (const auto& [type, name] : dtypes) {
      for (const char* shape : {"rows", "masked", "dim0_keepdim", "large"}) {
        Case c;
        c.id = absl::StrCat("logsumexp/", name, "/", shape);
        c.operation = operation();
        c.dtype = name;
        const std::string s = shape;
        at::Tensor x = at::randn({16, 257}, at::kDouble) * 4;
        if (s == "large") {
          x = x + 3e3;
          // The gradient is exp(x - lse): lse near 3e3 carries an absolute
          // rounding error of eps * 3e3, which becomes that relative error
          // of every gradient entry, whichever adapter computes it.
          const Tolerance base = tolerance_for(name);
          const double eps = type == at::kDouble ? 2.2e-16 : 1.2e-7;
          c.tolerance = Tolerance{base.atol, std::max(base.rtol, 4 * eps * 3.1e3)};
        }
        c.inputs["input"] = x.to(type);
        c.options = {{"dim", s == "dim0_keepdim" ? 0 : -1}, {"keepdim", s == "dim0_keepdim"}};
        if (s == "masked") {
          at::Tensor mask = at::rand({16, 257}) > 0.4;
          mask[3].fill_(false);  // an empty row: -inf, zero gradient
          c.inputs["mask"] = mask;
        }
        const std::int64_t out_rows = s == "dim0_keepdim" ? 257 : 16;
        c.inputs["upstream"] =
            at::randn({out_rows}, at::kDouble).to(type == at::kDouble ? at::kDouble : at::kFloat);
        cases.push_back(std::move(c));
      }
    }
    return cases;
  }

  result<Run> run(const Case& c, Backend backend) const override {
    LogsumexpOptions options;
    options.dim = c.options.value("dim", -1);
    options.keepdim = c.options.value("keepdim", false);
    if (auto m = c.inputs.find("mask"); m != c.inputs.end()) options.mask = m->second;
    options.dispatch.backend = backend;
    const at::Tensor input = c.inputs.at("input").detach().clone().requires_grad_(true);
    at::Tensor upstream = c.inputs.at("upstream");

    Run run;
    PeakMemory memory;
    auto start = std::chrono::steady_clock::now();
    result<LogsumexpOutput> out = logsumexp(input, options);
    run.forward_ms = elapsed_ms(start);
    if (!out) return out.error();
    const at::Tensor value = out.value().value;
    run.adapter = out.value().dispatch.adapter;
    start = std::chrono::steady_clock::now();
    const at::Tensor grad =
        torch::autograd::grad({value}, {input}, {upstream.reshape(value.sizes())})[0];
    run.backward_ms = elapsed_ms(start);
    run.peak_bytes = memory.peak_bytes();
    run.outputs["value"] = value.detach();
    run.outputs["grad_input"] = grad;
    return run;
  }
};

}  // namespace

std::unique_ptr<Family> make_logsumexp_family() {
  return std::make_unique<LogsumexpFamily>();
}

}  // namespace keel::harness
