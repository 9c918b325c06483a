// The spec of a call as it applies to some of its sequences: every tensor
// the masks and the bias hold per sequence narrowed to them, and, for a
// paged sequence, every key-indexed tensor narrowed to its own keys.
#pragma once

#include <cstdint>

#include "keel/v1/attention.h"

namespace keel::kernels {

// The spec as it applies to sequence b of a batch of `batch` alone; a tensor
// that broadcasts over the batch is kept whole.
AttentionSpec batch_slice(const AttentionSpec& spec, std::int64_t b, std::int64_t batch);

// Sequence b of a paged call, as the contiguous call on its own `len` keys:
// the batch narrowed to b, and every key-indexed tensor (document ids,
// boolean mask, bias) narrowed from the table's `logical_len` keys to `len`.
AttentionSpec paged_sequence_spec(const AttentionSpec& spec, std::int64_t b, std::int64_t batch,
                                  std::int64_t len, std::int64_t logical_len);

}  // namespace keel::kernels
