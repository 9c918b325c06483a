#include "vocab_parallel.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <c10/core/GradMode.h>

#include "guard.h"
#include "string_view_bridge.h"

namespace keel::internal {
namespace {

constexpr const char* kOp = "linear_cross_entropy";

// One int64 per field, in this order, per rank. kValid, kStart and
// kClasses describe the rank; every other field must be equal on all.
enum Field : std::size_t {
  kValid,
  kStart,
  kClasses,
  kTokens,
  kFeatures,
  kDtype,
  kReduction,
  kIgnoreIndex,
  kLabelSmoothing,
  kZLoss,
  kLogitSoftcap,
  kClassWeights,
  kBias,
  kGradients,
  kChunkSize,
  kVocabChunkSize,
  kChunkBudget,
  kAccumulation,
  kTargets,
  kFieldCount,
};

// What a message calls each field that must agree.
constexpr std::array<const char*, kFieldCount> kFieldNames{
    "",
    "options.vocab_parallel.vocab_start",
    "weight.size(0)",
    "the token count (target.numel())",
    "the feature count (hidden.size(-1))",
    "hidden's dtype",
    "options.reduction",
    "options.ignore_index",
    "options.label_smoothing",
    "options.z_loss",
    "options.logit_softcap",
    "whether options.class_weights is given",
    "whether options.bias is given",
    "which of hidden, weight and bias want a gradient",
    "options.chunk_size",
    "options.vocab_chunk_size",
    "options.chunk_budget_bytes",
    "options.accumulation_dtype",
    "target (the class indices)",
};

bool is_double_field(std::size_t f) {
  return f == kLabelSmoothing || f == kZLoss || f == kLogitSoftcap;
}

std::int64_t bits_of(double x) {
  std::int64_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

std::string value_text(std::size_t field, std::int64_t v) {
  if (!is_double_field(field)) return std::to_string(v);
  double x = 0;
  std::memcpy(&x, &v, sizeof x);
  return absl::StrCat(x);
}

// A fingerprint of the targets, equal on every rank that holds the same
// ones: sum_i (y_i + 1) * (i mod 65521 + 1), in wrapping int64.
std::int64_t fingerprint(const at::Tensor& target) {
  const at::Tensor y = target.reshape({-1});
  const at::Tensor position = at::arange(y.numel(), y.options()).remainder_(65521).add_(1);
  return (y + 1).mul_(position).sum().item<std::int64_t>();
}

std::vector<std::int64_t> layout(const at::Tensor& hidden, const at::Tensor& weight,
                                 const at::Tensor& target, const LinearCrossEntropyOptions& o) {
  std::vector<std::int64_t> f(kFieldCount, 0);
  f[kValid] = 1;
  f[kStart] = o.vocab_parallel.vocab_start;
  f[kClasses] = weight.size(0);
  f[kTokens] = target.numel();
  f[kFeatures] = hidden.size(-1);
  f[kDtype] = static_cast<std::int64_t>(hidden.scalar_type());
  f[kReduction] = static_cast<std::int64_t>(o.reduction);
  f[kIgnoreIndex] = o.ignore_index;
  f[kLabelSmoothing] = bits_of(o.label_smoothing);
  f[kZLoss] = bits_of(o.z_loss);
  f[kLogitSoftcap] = bits_of(o.logit_softcap);
  f[kClassWeights] = o.class_weights.defined() ? 1 : 0;
  f[kBias] = o.bias.defined() ? 1 : 0;
  if (c10::GradMode::is_enabled()) {
    f[kGradients] = (hidden.requires_grad() ? 1 : 0) | (weight.requires_grad() ? 2 : 0) |
                    (o.bias.defined() && o.bias.requires_grad() ? 4 : 0);
  }
  f[kChunkSize] = o.chunk_size;
  f[kVocabChunkSize] = o.vocab_chunk_size;
  f[kChunkBudget] = o.chunk_budget_bytes;
  f[kAccumulation] = static_cast<std::int64_t>(o.accumulation_dtype);
  f[kTargets] = fingerprint(target);
  return f;
}

Error collective_failed(const Error& e, std::string_view what) {
  return {e.code(), absl::StrCat(kOp, ": vocab_parallel: ", to_absl(what), ": ", e.message())};
}

using Layouts = at::TensorAccessor<std::int64_t, 2>;

// The first field on which some rank differs from rank 0, as an error.
std::optional<Error> disagreement(const Layouts& all) {
  const auto ranks = all.size(0);
  for (std::size_t f = kTokens; f < kFieldCount; ++f) {
    const auto field = static_cast<std::int64_t>(f);
    const std::int64_t want = all[0][field];
    for (std::int64_t r = 1; r < ranks; ++r) {
      const std::int64_t got = all[r][field];
      if (got == want) continue;
      std::string values = f == kTargets
                               ? ""
                               : absl::StrCat(" (rank 0: ", value_text(f, want), ", rank ", r, ": ",
                                              value_text(f, got), ")");
      return Error(Errc::invalid_argument,
                   absl::StrCat(kOp, ": vocab_parallel: ", kFieldNames[f],
                                " differs between rank 0 and rank ", r, values,
                                "; every rank of a vocabulary-parallel call passes the same "
                                "tokens, targets and options, and holds its own shard of weight"));
    }
  }
  return std::nullopt;
}

}  // namespace

result<VocabShard> agree_on_vocab_shards(const at::Tensor& hidden, const at::Tensor& weight,
                                         const at::Tensor& target,
                                         const LinearCrossEntropyOptions& options,
                                         const result<void>& local) {
  comm::Communicator comm = *options.vocab_parallel.communicator;
  const comm::CallOptions call = options.vocab_parallel.call;
  std::vector<std::int64_t> mine(kFieldCount, 0);
  if (local) {
    result<std::vector<std::int64_t>> made =
        guarded(kOp, "core", [&] { return layout(hidden, weight, target, options); });
    if (!made) return made.error();
    mine = std::move(made).value();
  }
  const auto fields = static_cast<std::int64_t>(kFieldCount);
  const at::Tensor in = at::tensor(mine, at::kLong);
  at::Tensor out = at::empty({comm.size() * fields}, at::kLong);
  result<void> exchanged = comm.all_gather(out, in, call);
  if (!local) return local.error();
  if (!exchanged) return collective_failed(exchanged.error(), "exchanging the call's layout");
  const at::Tensor table = out.view({comm.size(), fields});
  const Layouts all = table.accessor<std::int64_t, 2>();

  for (int r = 0; r < comm.size(); ++r) {
    if (all[r][kValid] == 0) {
      return Error(Errc::invalid_argument,
                   absl::StrCat(kOp, ": vocab_parallel: rank ", r,
                                "'s arguments are invalid (its own call returns why)"));
    }
  }
  if (std::optional<Error> e = disagreement(all)) return *e;

  // The shards, sorted by their first class, must follow each other from 0.
  std::vector<std::array<std::int64_t, 3>> shards;  // start, classes, rank
  shards.reserve(static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) {
    shards.push_back({all[r][kStart], all[r][kClasses], r});
  }
  std::sort(shards.begin(), shards.end());
  std::int64_t end = 0;
  std::int64_t largest = 0;
  for (const auto& [start, classes, rank] : shards) {
    if (start != end) {
      return Error(Errc::invalid_argument,
                   absl::StrCat(kOp, ": vocab_parallel: rank ", rank, "'s shard starts at class ",
                                start, ", but the shards below it end at ", end, " (a ",
                                start > end ? "gap" : "overlap",
                                "); the ranks' [vocab_start, vocab_start + weight.size(0)) must "
                                "tile [0, V) exactly once"));
    }
    end += classes;
    largest = std::max(largest, classes);
  }

  VocabShard shard;
  shard.start = options.vocab_parallel.vocab_start;
  shard.vocab = end;
  shard.largest = largest;
  shard.gather = [comm, call](const at::Tensor& t) mutable {
    const at::Tensor flat = t.contiguous().view({-1});
    at::Tensor gathered = at::empty({comm.size() * flat.numel()}, flat.options());
    if (result<void> r = comm.all_gather(gathered, flat, call); !r) {
      throw ErrorException(collective_failed(r.error(), "combining the shards' per-token terms"));
    }
    std::vector<std::int64_t> sizes{comm.size()};
    sizes.insert(sizes.end(), t.sizes().begin(), t.sizes().end());
    return gathered.view(sizes);
  };
  shard.sum = [comm, call](const at::Tensor& t) mutable {
    at::Tensor summed = t;
    if (result<void> r = comm.all_reduce(summed, comm::ReduceOp::sum, call); !r) {
      throw ErrorException(collective_failed(r.error(), "summing grad_hidden across the shards"));
    }
  };
  return shard;
}

}  // namespace keel::internal
