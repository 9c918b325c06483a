// keel::linear_cross_entropy: validation, then dispatch.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <c10/core/ScalarType.h>

#include "dispatch/linear_cross_entropy.h"
#include "dispatcher.h"
#include "guard.h"
#include "keel/v1/dtype.h"
#include "keel/v1/loss.h"
#include "validate.h"
#include "vocab_parallel.h"

namespace keel {
inline namespace v1 {

namespace {

constexpr const char* kOp = "linear_cross_entropy";

result<void> validate_tensors(const at::Tensor& hidden, const at::Tensor& weight,
                              const at::Tensor& target) {
  if (!hidden.defined()) return internal::invalid(kOp, "hidden is an undefined tensor");
  if (!weight.defined()) return internal::invalid(kOp, "weight is an undefined tensor");
  if (!target.defined()) return internal::invalid(kOp, "target is an undefined tensor");
  if (!internal::is_supported_float(hidden.scalar_type())) {
    return internal::invalid(kOp, absl::StrCat("hidden has dtype ", keel::dtype_name(hidden),
                                               "; expected ", internal::kSupportedFloats));
  }
  if (weight.scalar_type() != hidden.scalar_type()) {
    return internal::invalid(
        kOp, absl::StrCat("weight has dtype ", keel::dtype_name(weight), " but hidden has ",
                          keel::dtype_name(hidden), " (expected the same dtype)"));
  }
  if (target.scalar_type() != at::kLong) {
    return internal::invalid(kOp, absl::StrCat("target has dtype ", keel::dtype_name(target),
                                               "; expected int64 class indices"));
  }
  for (const auto& [name, t] : {std::pair{"weight", &weight}, std::pair{"target", &target}}) {
    result<void> device = internal::check_same_device(kOp, name, *t, "hidden", hidden);
    if (!device) return device;
  }
  if (hidden.dim() != 2 && hidden.dim() != 3) {
    return internal::invalid(kOp, absl::StrCat("hidden has shape ", internal::shape_text(hidden),
                                               "; expected [N, D] or [B, T, D]"));
  }
  if (weight.dim() != 2) {
    return internal::invalid(
        kOp, absl::StrCat("weight has shape ", internal::shape_text(weight), "; expected [V, D]"));
  }
  if (weight.size(1) != hidden.size(-1)) {
    return internal::invalid(
        kOp, absl::StrCat("weight has ", weight.size(1), " columns but hidden has ",
                          hidden.size(-1), " (expected weight [V, D] with D = hidden.size(-1))"));
  }
  if (weight.size(0) == 0)
    return internal::invalid(kOp, "weight has 0 rows; expected V >= 1 classes");
  const auto leading = hidden.sizes().slice(0, hidden.dim() - 1);
  if (target.sizes() != leading) {
    return internal::invalid(
        kOp, absl::StrCat("target has shape ", internal::shape_text(target), "; expected [",
                          absl::StrJoin(leading, ", "), "], hidden's leading shape"));
  }
  return success();
}

result<void> validate_vector(const char* name, const at::Tensor& t, const at::Tensor& hidden,
                             std::int64_t vocab) {
  if (!t.defined()) return success();
  if (!internal::is_supported_float(t.scalar_type())) {
    return internal::invalid(
        kOp, absl::StrCat(name, " has dtype ", keel::dtype_name(t), "; expected a floating dtype"));
  }
  result<void> device = internal::check_same_device(kOp, name, t, "hidden", hidden);
  if (!device) return device;
  if (t.dim() != 1 || t.size(0) != vocab) {
    return internal::invalid(
        kOp, absl::StrCat(name, " has shape ", internal::shape_text(t), "; expected [", vocab,
                          "], one entry per row of weight"));
  }
  return success();
}

result<void> validate_options(const at::Tensor& hidden, const at::Tensor& weight,
                              const LinearCrossEntropyOptions& o) {
  const std::int64_t vocab = weight.size(0);
  switch (o.reduction) {
    case Reduction::mean:
    case Reduction::sum:
    case Reduction::none:
      break;
    default:
      return internal::invalid(kOp,
                               absl::StrCat("options.reduction is ", static_cast<int>(o.reduction),
                                            ", not a keel::Reduction"));
  }
  if (!std::isfinite(o.label_smoothing) || o.label_smoothing < 0 || o.label_smoothing > 1) {
    return internal::invalid(kOp, absl::StrCat("options.label_smoothing is ", o.label_smoothing,
                                               "; expected a number in [0, 1]"));
  }
  if (!std::isfinite(o.z_loss) || o.z_loss < 0) {
    return internal::invalid(kOp, absl::StrCat("options.z_loss is ", o.z_loss,
                                               "; expected a finite coefficient >= 0 (0 = off)"));
  }
  if (!std::isfinite(o.logit_softcap) || o.logit_softcap < 0) {
    return internal::invalid(kOp, absl::StrCat("options.logit_softcap is ", o.logit_softcap,
                                               "; expected a finite cap >= 0 (0 = off)"));
  }
  if (o.chunk_size < 0) {
    return internal::invalid(
        kOp, absl::StrCat("options.chunk_size is ", o.chunk_size,
                          "; expected a token count >= 1, or 0 for the automatic size"));
  }
  if (o.vocab_chunk_size < 0) {
    return internal::invalid(
        kOp, absl::StrCat("options.vocab_chunk_size is ", o.vocab_chunk_size,
                          "; expected a class count >= 1, or 0 for the automatic size"));
  }
  if (o.chunk_budget_bytes < 0) {
    return internal::invalid(
        kOp, absl::StrCat("options.chunk_budget_bytes is ", o.chunk_budget_bytes,
                          "; expected a byte count >= 1, or 0 for the default budget"));
  }
  const at::ScalarType acc = o.accumulation_dtype;
  if (acc != at::ScalarType::Undefined && acc != at::kFloat && acc != at::kDouble) {
    return internal::invalid(kOp,
                             absl::StrCat("options.accumulation_dtype is ", c10::toString(acc),
                                          "; expected Float, Double or Undefined (automatic)"));
  }
  if (acc == at::kFloat && hidden.scalar_type() == at::kDouble) {
    return internal::invalid(
        kOp,
        "options.accumulation_dtype is Float but hidden is Double; accumulating float64 "
        "input in float32 would lose precision (expected Double or Undefined)");
  }
  if (result<void> r = validate_vector("options.class_weights", o.class_weights, hidden, vocab);
      !r) {
    return r;
  }
  if (result<void> r = validate_vector("options.bias", o.bias, hidden, vocab); !r) return r;
  if (o.vocab_parallel.vocab_start < 0) {
    return internal::invalid(
        kOp, absl::StrCat("options.vocab_parallel.vocab_start is ", o.vocab_parallel.vocab_start,
                          "; expected a class index >= 0"));
  }
  if (o.vocab_parallel.vocab_start != 0 && !o.vocab_parallel.communicator.has_value()) {
    return internal::invalid(
        kOp, absl::StrCat("options.vocab_parallel.vocab_start is ", o.vocab_parallel.vocab_start,
                          " but options.vocab_parallel.communicator is unset (a shard "
                          "needs the group that holds the other classes)"));
  }
  if (o.bias.defined() && o.bias.scalar_type() != weight.scalar_type()) {
    return internal::invalid(
        kOp, absl::StrCat("options.bias has dtype ", keel::dtype_name(o.bias), " but weight has ",
                          keel::dtype_name(weight), " (expected the same dtype)"));
  }
  return success();
}

// One pass over the targets (min and max of the non-ignored ones) rather
// than letting a bad index reach gather(), where it is undefined behaviour
// on some devices.
// Returns the complaint, empty when every target is fine.
std::string check_target_range(const at::Tensor& target, std::int64_t vocab,
                               std::int64_t ignore_index) {
  if (target.numel() == 0) return {};
  const at::Tensor kept = target.ne(ignore_index);
  const at::Tensor lo = at::where(kept, target, at::full({}, vocab - 1, target.options())).min();
  const at::Tensor hi = at::where(kept, target, at::zeros({}, target.options())).max();
  const auto min = lo.item<std::int64_t>();
  const auto max = hi.item<std::int64_t>();
  if (min < 0 || max >= vocab) {
    const std::int64_t bad = min < 0 ? min : max;
    return absl::StrCat("target holds ", bad, ", outside [0, ", vocab,
                        ") (the vocabulary) and not options.ignore_index (", ignore_index, ")");
  }
  return {};
}

result<void> validate(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& target,
                      const LinearCrossEntropyOptions& options) {
  if (result<void> r = validate_tensors(hidden, weight, target); !r) return r.error();
  if (result<void> r = validate_options(hidden, weight, options); !r) return r.error();
  return success();
}

}  // namespace

result<LossOutput> linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                        const at::Tensor& target,
                                        const LinearCrossEntropyOptions& options) {
  const result<void> valid = validate(hidden, weight, target, options);
  // A vocabulary-parallel call first agrees with the other ranks on the
  // layout (a rank with bad arguments still takes part, so that none
  // waits), and learns the whole vocabulary's size.
  std::optional<internal::VocabShard> shard;
  if (options.vocab_parallel.communicator.has_value()) {
    result<internal::VocabShard> agreed =
        internal::agree_on_vocab_shards(hidden, weight, target, options, valid);
    if (!agreed) return agreed.error();
    shard = std::move(agreed).value();
  } else if (!valid) {
    return valid.error();
  }
  const std::int64_t vocab = shard ? shard->vocab : weight.size(0);
  result<std::string> range = internal::guarded(
      kOp, "core", [&] { return check_target_range(target, vocab, options.ignore_index); });
  if (!range) return range.error();
  if (!range.value().empty()) return internal::invalid(kOp, range.value());

  // The row count is explicit: reshape({-1, D}) cannot infer it when D is 0.
  const at::Tensor hidden_2d = hidden.reshape({target.numel(), hidden.size(-1)});
  const at::Tensor target_1d = target.reshape({-1});
  const internal::LinearCrossEntropyCall call{hidden_2d, weight, target_1d, options,
                                              shard ? &*shard : nullptr};
  auto ran = internal::dispatch_and_run(kOp, options.dispatch, call,
                                        &internal::Adapter::linear_cross_entropy);
  if (!ran) return ran.error();

  LossOutput output;
  internal::LinearCrossEntropyResult& r = ran.value().value;
  output.loss = options.reduction == Reduction::none ? r.loss.view(target.sizes()) : r.loss;
  if (options.return_per_token_loss) output.per_token_loss = r.per_token_loss.view(target.sizes());
  if (options.return_lse) output.lse = r.lse.view(target.sizes());
  output.dispatch = std::move(ran.value().info);
  return output;
}

}  // namespace v1
}  // namespace keel
