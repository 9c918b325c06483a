// The compat adapter's linear_cross_entropy: keel's chunked implementation
// (kernels/chunked_linear_cross_entropy.*), on ATen ops present since 2.9.
#include "compat/linear_cross_entropy.h"

#include <memory>
#include <utility>

#include <ATen/DeviceGuard.h>

#include "chunked_linear_cross_entropy.h"

namespace keel::adapters {

static_assert(kernels::kMinAutomaticBudgetBytes == kLinearCrossEntropyChunkBudgetBytes,
              "compat's automatic budget has the floor keel/v1/loss.h documents");
static_assert(kernels::kGradientBytesPerBudgetByte == 8,
              "keel/v1/loss.h documents the automatic budget as an eighth of the gradients");

internal::LinearCrossEntropyResult CompatLinearCrossEntropy::run(
    const internal::LinearCrossEntropyCall& call) const {
  const LinearCrossEntropyOptions& o = call.options;
  // The chunks allocate on hidden's device: make it current, so that a call
  // on cuda:1 from a thread whose current device is cuda:0 stays on cuda:1.
  const at::OptionalDeviceGuard device(at::device_of(call.hidden));
  kernels::LinearCrossEntropyConfig config;
  config.reduction = o.reduction;
  config.ignore_index = o.ignore_index;
  config.label_smoothing = o.label_smoothing;
  config.z_loss = o.z_loss;
  config.logit_softcap = o.logit_softcap;
  config.chunk_size = o.chunk_size;
  config.vocab_chunk_size = o.vocab_chunk_size;
  config.budget_bytes = o.chunk_budget_bytes;  // 0: automatic
  config.accumulation = o.accumulation_dtype;
  if (call.shard != nullptr) {
    auto shard = std::make_shared<kernels::VocabShard>();
    shard->start = call.shard->start;
    shard->vocab = call.shard->vocab;
    shard->largest = call.shard->largest;
    shard->gather = call.shard->gather;
    shard->sum = call.shard->sum;
    config.shard = std::move(shard);
  }
  kernels::LinearCrossEntropyOutputs out = kernels::chunked_linear_cross_entropy(
      call.hidden, call.weight, o.bias, call.target, o.class_weights, config);
  return {std::move(out.loss), std::move(out.per_token_loss), std::move(out.lse)};
}

const internal::Capability& CompatLinearCrossEntropy::capability() const noexcept {
  static const internal::Capability kCapability = internal::Capability::floating(
      "linear_cross_entropy",
      {"reduction mean/sum/none", "ignore_index", "label_smoothing", "class_weights", "z_loss",
       "logit_softcap", "bias", "chunk_size",
       "vocab_chunk_size (online log-sum-exp, recompute in backward)", "chunk_budget_bytes",
       "accumulation_dtype float32/float64", "per-token loss and lse",
       "vocab_parallel (weight sharded by vocabulary over a keel::comm::Communicator)"},
      "kernels::chunked_linear_cross_entropy: token chunks, logits never materialised, "
      "gradients formed in forward into the accumulation-dtype buffers handed to autograd, "
      "or recomputed in backward with vocabulary blocks");
  return kCapability;
}

}  // namespace keel::adapters
