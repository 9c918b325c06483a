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
#include "keel/v1/loss.h"
#include "vocab_parallel.h"

namespace keel {
inline namespace v1 {

namespace {

constexpr const char* kOp = "linear_cross_entropy";

std::string shape_of(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

bool is_floating(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

Error invalid(const std::string& what) {
  return {Errc::invalid_argument, absl::StrCat(kOp, ": ", what)};
}

result<void> validate_tensors(const at::Tensor& hidden, const at::Tensor& weight,
                              const at::Tensor& target) {
  if (!hidden.defined()) return invalid("hidden is an undefined tensor");
  if (!weight.defined()) return invalid("weight is an undefined tensor");
  if (!target.defined()) return invalid("target is an undefined tensor");
  if (!is_floating(hidden.scalar_type())) {
    return invalid(absl::StrCat("hidden has dtype ", c10::toString(hidden.scalar_type()),
                                "; expected float16, bfloat16, float32 or float64"));
  }
  if (weight.scalar_type() != hidden.scalar_type()) {
    return invalid(absl::StrCat("weight has dtype ", c10::toString(weight.scalar_type()),
                                " but hidden has ", c10::toString(hidden.scalar_type()),
                                " (expected the same dtype)"));
  }
  if (target.scalar_type() != at::kLong) {
    return invalid(absl::StrCat("target has dtype ", c10::toString(target.scalar_type()),
                                "; expected int64 class indices"));
  }
  if (weight.device() != hidden.device()) {
    return invalid(absl::StrCat("weight is on ", weight.device().str(), " but hidden is on ",
                                hidden.device().str()));
  }
  if (target.device() != hidden.device()) {
    return invalid(absl::StrCat("target is on ", target.device().str(), " but hidden is on ",
                                hidden.device().str()));
  }
  if (hidden.dim() != 2 && hidden.dim() != 3) {
    return invalid(
        absl::StrCat("hidden has shape ", shape_of(hidden), "; expected [N, D] or [B, T, D]"));
  }
  if (weight.dim() != 2) {
    return invalid(absl::StrCat("weight has shape ", shape_of(weight), "; expected [V, D]"));
  }
  if (weight.size(1) != hidden.size(-1)) {
    return invalid(absl::StrCat("weight has ", weight.size(1), " columns but hidden has ",
                                hidden.size(-1),
                                " (expected weight [V, D] with D = hidden.size(-1))"));
  }
  if (weight.size(0) == 0) return invalid("weight has 0 rows; expected V >= 1 classes");
  const auto leading = hidden.sizes().slice(0, hidden.dim() - 1);
  if (target.sizes() != leading) {
    return invalid(absl::StrCat("target has shape ", shape_of(target), "; expected [",
                                absl::StrJoin(leading, ", "), "], hidden's leading shape"));
  }
  return success();
}

result<void> validate_vector(const char* name, const at::Tensor& t, const at::Tensor& hidden,
                             std::int64_t vocab) {
  if (!t.defined()) return success();
  if (!is_floating(t.scalar_type())) {
    return invalid(absl::StrCat(name, " has dtype ", c10::toString(t.scalar_type()),
                                "; expected a floating dtype"));
  }
  if (t.device() != hidden.device()) {
    return invalid(absl::StrCat(name, " is on ", t.device().str(), " but hidden is on ",
                                hidden.device().str()));
  }
  if (t.dim() != 1 || t.size(0) != vocab) {
    return invalid(absl::StrCat(name, " has shape ", shape_of(t), "; expected [", vocab,
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
      return invalid(absl::StrCat("options.reduction is ", static_cast<int>(o.reduction),
                                  ", not a keel::Reduction"));
  }
  if (!std::isfinite(o.label_smoothing) || o.label_smoothing < 0 || o.label_smoothing > 1) {
    return invalid(absl::StrCat("options.label_smoothing is ", o.label_smoothing,
                                "; expected a number in [0, 1]"));
  }
  if (!std::isfinite(o.z_loss) || o.z_loss < 0) {
    return invalid(absl::StrCat("options.z_loss is ", o.z_loss,
                                "; expected a finite coefficient >= 0 (0 = off)"));
  }
  if (!std::isfinite(o.logit_softcap) || o.logit_softcap < 0) {
    return invalid(absl::StrCat("options.logit_softcap is ", o.logit_softcap,
                                "; expected a finite cap >= 0 (0 = off)"));
  }
  if (o.chunk_size < 0) {
    return invalid(absl::StrCat("options.chunk_size is ", o.chunk_size,
                                "; expected a token count >= 1, or 0 for the automatic size"));
  }
  if (o.vocab_chunk_size < 0) {
    return invalid(absl::StrCat("options.vocab_chunk_size is ", o.vocab_chunk_size,
                                "; expected a class count >= 1, or 0 for the automatic size"));
  }
  if (o.chunk_budget_bytes < 0) {
    return invalid(absl::StrCat("options.chunk_budget_bytes is ", o.chunk_budget_bytes,
                                "; expected a byte count >= 1, or 0 for the default budget"));
  }
  const at::ScalarType acc = o.accumulation_dtype;
  if (acc != at::ScalarType::Undefined && acc != at::kFloat && acc != at::kDouble) {
    return invalid(absl::StrCat("options.accumulation_dtype is ", c10::toString(acc),
                                "; expected Float, Double or Undefined (automatic)"));
  }
  if (acc == at::kFloat && hidden.scalar_type() == at::kDouble) {
    return invalid(
        "options.accumulation_dtype is Float but hidden is Double; accumulating float64 "
        "input in float32 would lose precision (expected Double or Undefined)");
  }
  if (result<void> r = validate_vector("options.class_weights", o.class_weights, hidden, vocab);
      !r) {
    return r;
  }
  if (result<void> r = validate_vector("options.bias", o.bias, hidden, vocab); !r) return r;
  if (o.vocab_parallel.vocab_start < 0) {
    return invalid(absl::StrCat("options.vocab_parallel.vocab_start is ",
                                o.vocab_parallel.vocab_start, "; expected a class index >= 0"));
  }
  if (o.vocab_parallel.vocab_start != 0 && !o.vocab_parallel.communicator.has_value()) {
    return invalid(absl::StrCat("options.vocab_parallel.vocab_start is ",
                                o.vocab_parallel.vocab_start,
                                " but options.vocab_parallel.communicator is unset (a shard "
                                "needs the group that holds the other classes)"));
  }
  if (o.bias.defined() && o.bias.scalar_type() != weight.scalar_type()) {
    return invalid(absl::StrCat("options.bias has dtype ", c10::toString(o.bias.scalar_type()),
                                " but weight has ", c10::toString(weight.scalar_type()),
                                " (expected the same dtype)"));
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
  if (!range.value().empty()) return invalid(range.value());

  result<internal::Request> request = internal::resolve_request(options.dispatch);
  if (!request) return request.error();

  // The row count is explicit: reshape({-1, D}) cannot infer it when D is 0.
  const at::Tensor hidden_2d = hidden.reshape({target.numel(), hidden.size(-1)});
  const at::Tensor target_1d = target.reshape({-1});
  const internal::LinearCrossEntropyCall call{hidden_2d, weight, target_1d, options,
                                              shard ? &*shard : nullptr};
  auto selection = internal::select(internal::Registry::builtin(), kOp, request.value(), call,
                                    &internal::Adapter::linear_cross_entropy);
  if (!selection) return selection.error();

  const internal::LinearCrossEntropyKernel* kernel = selection.value().kernel;
  result<internal::LinearCrossEntropyResult> out =
      internal::guarded(kOp, selection.value().info.adapter, [&] { return kernel->run(call); });
  if (!out) return out.error();

  LossOutput output;
  internal::LinearCrossEntropyResult& r = out.value();
  output.loss = options.reduction == Reduction::none ? r.loss.view(target.sizes()) : r.loss;
  if (options.return_per_token_loss) output.per_token_loss = r.per_token_loss.view(target.sizes());
  if (options.return_lse) output.lse = r.lse.view(target.sizes());
  output.dispatch = std::move(selection).value().info;
  return output;
}

}  // namespace v1
}  // namespace keel
