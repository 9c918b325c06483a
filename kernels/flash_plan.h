// The flash route's planner: which calls of libtorch's CPU flash kernel
// serve an attention under a mask spec. A pure function of the spec and the
// shapes (no tensor of q, k or v is read), so its group counts are unit-
// tested (tests/unit/flash_plan_test.cpp); block_sparse_attention.cpp runs
// the plan inside its autograd node.
//
// The visible keys of each query block form a few contiguous ranges (one for
// causal, window, chunk and document masks), so each range is one call over
// narrow views of q, k and v, with an additive element mask only where a
// block is partial. Query blocks whose calls have the same shape and mask,
// at evenly spaced positions, are batched into one call: the spacing becomes
// the stride of a "heads" axis of an as_strided view (no copies, even when
// the key ranges overlap).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "attention_mask.h"
#include "keel/v1/attention.h"

namespace keel::kernels {

// Queries [q0 + i * q_step, + rows) against keys [k0 + i * k_step, + len) for
// i < count, in batches [b0, b0 + nb): one call of the flash kernel.
struct FlashGroup {
  std::int64_t b0 = 0;
  std::int64_t nb = 1;
  std::int64_t count = 1;
  std::int64_t q0 = 0;
  std::int64_t q_step = 0;
  std::int64_t rows = 0;
  std::int64_t k0 = 0;
  std::int64_t k_step = 0;
  std::int64_t len = 0;
  // The kernel's own top-left causal mask (a whole plain causal call).
  bool causal = false;
  // Additive (0 / -inf), in the compute dtype: [rows, len] or
  // [nb * Hq, 1, rows, len]; undefined when every key of the range is visible.
  at::Tensor mask;
  // Bool, broadcastable to [nb * Hq, count, rows]: rows that see a key of the
  // range; undefined when all do. The kernel gives lse 0 to an empty row.
  at::Tensor nonempty;
  // Rows an earlier group wrote: this call's part is merged by log-sum-exp.
  bool merge = false;
};

// The block sizes a spec is planned in: those of its first block-mask term,
// else 128 by 128.
std::pair<std::int64_t, std::int64_t> block_sizes(const AttentionSpec& spec);

// The calls for `spec` over `geometry`, in the order they run: every group
// after the first that covers a row merges into it by log-sum-exp. Masks are
// made on the CPU in `dtype` (the kernel's compute dtype).
std::vector<FlashGroup> plan_flash_groups(const AttentionSpec& spec, const MaskGeometry& geometry,
                                          at::ScalarType dtype);

}  // namespace keel::kernels
