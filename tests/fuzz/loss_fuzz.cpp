// Fuzz target: keel::linear_cross_entropy with fuzzed shapes, dtypes,
// layouts, targets (inside and outside [0, V), ignore_index) and every
// option, including enum values out of range and extreme chunk sizes and
// budgets. Every call must come back as a value or a keel::Error; a value
// must have the documented shape, and a backward through it must not crash.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_input.h"
#include "keel/v1/loss.h"

using keel::fuzz::dim;
using keel::fuzz::dtype;
using keel::fuzz::parameter;
using keel::fuzz::real;
using keel::fuzz::tensor;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const bool batched = in.ConsumeBool();
  const std::int64_t b = dim(in);
  const std::int64_t t = dim(in);
  const std::int64_t n = batched ? b * t : dim(in);
  const std::int64_t d = dim(in);
  const std::int64_t v = dim(in);
  const at::ScalarType type = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? dtype(in) : at::kFloat;

  keel::LinearCrossEntropyOptions o;
  o.reduction = static_cast<keel::Reduction>(in.ConsumeIntegralInRange<std::uint8_t>(0, 3));
  o.ignore_index = in.ConsumeBool() ? -100 : in.ConsumeIntegralInRange<std::int64_t>(-2, 10);
  const std::vector<std::int64_t> lead =
      batched ? std::vector<std::int64_t>{b, t} : std::vector<std::int64_t>{n};
  std::vector<std::int64_t> hidden_shape = lead;
  hidden_shape.push_back(d);
  const at::Tensor hidden = tensor(in, hidden_shape, type);
  const at::Tensor weight = tensor(in, {v, d}, in.ConsumeBool() ? type : dtype(in));
  const at::Tensor target = tensor(
      in, lead, in.ConsumeIntegralInRange<int>(0, 5) == 0 ? dtype(in) : at::kLong, -2, v + 1);
  if (in.ConsumeBool()) o.label_smoothing = real(in);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    o.class_weights = tensor(in, {v}, in.ConsumeBool() ? at::kFloat : dtype(in));
  }
  if (in.ConsumeBool()) o.z_loss = real(in);
  if (in.ConsumeBool()) o.logit_softcap = real(in);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0)
    o.bias = tensor(in, {v}, in.ConsumeBool() ? type : dtype(in));
  if (in.ConsumeBool()) o.chunk_size = parameter(in);
  if (in.ConsumeBool()) o.vocab_chunk_size = parameter(in);
  if (in.ConsumeBool()) o.chunk_budget_bytes = parameter(in);
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    // Any ScalarType code, including ones that are not float types.
    o.accumulation_dtype =
        static_cast<c10::ScalarType>(in.ConsumeIntegralInRange<std::int8_t>(-1, 50));
  }
  o.return_per_token_loss = in.ConsumeBool();
  o.return_lse = in.ConsumeBool();
  o.dispatch.backend = keel::fuzz::backend(in);
  const bool grad = in.ConsumeBool();

  at::Tensor h = hidden;
  at::Tensor w = weight;
  const auto differentiable = [](const at::Tensor& x) {
    return x.defined() && at::isFloatingType(x.scalar_type()) && !x.is_meta();
  };
  if (grad && differentiable(h)) h = h.detach().requires_grad_(true);
  if (grad && differentiable(w)) w = w.detach().requires_grad_(true);
  if (grad && differentiable(o.bias) && in.ConsumeBool())
    o.bias = o.bias.detach().requires_grad_(true);

  const keel::result<keel::LossOutput> r = keel::linear_cross_entropy(h, w, target, o);
  if (!r) return 0;
  const keel::LossOutput& out = r.value();
  const bool per_token = o.reduction == keel::Reduction::none;
  if (per_token ? out.loss.sizes() != target.sizes() : out.loss.dim() != 0) __builtin_trap();
  if (o.return_per_token_loss && out.per_token_loss.sizes() != target.sizes()) __builtin_trap();
  if (o.return_lse && out.lse.sizes() != target.sizes()) __builtin_trap();
  if (out.loss.requires_grad()) out.loss.sum().backward();
  return 0;
}
