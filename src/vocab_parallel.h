// The vocabulary-parallel loss's agreement step: before any rank touches
// its shard, the ranks of the group exchange their call's layout and
// check that they agree, so that a wrong call on one rank gives every rank
// an error instead of a hang or a wrong number.
#pragma once

#include <ATen/core/Tensor.h>

#include "dispatch/linear_cross_entropy.h"
#include "keel/v1/error.h"
#include "keel/v1/loss.h"

namespace keel::internal {

// Exchanges this rank's layout with the group of
// options.vocab_parallel.communicator (one all_gather of int64), checks
// that every rank passes the same token count, features, dtypes, options,
// gradient wishes and targets, and that the shards tile [0, V), then
// returns this rank's shard with the collectives the kernel combines its
// per-token vectors with. `local` is this rank's own validation: a rank
// whose arguments are wrong still takes part in the exchange (so that the
// others do not wait for it) and returns its own error; the others return
// invalid_argument naming it. A failed exchange returns the
// communicator's error (peer_lost, timeout, aborted).
result<VocabShard> agree_on_vocab_shards(const at::Tensor& hidden, const at::Tensor& weight,
                                         const at::Tensor& target,
                                         const LinearCrossEntropyOptions& options,
                                         const result<void>& local);

}  // namespace keel::internal
