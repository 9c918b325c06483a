// The attention kernel of the compat adapter: dense calls SDPA computes
// exactly go to at::scaled_dot_product_attention, the rest to
// kernels::block_sparse_attention (DispatchInfo::reason says which, and why).
#pragma once

#include "dispatch/attention.h"

namespace keel::adapters {

const internal::AttentionKernel& compat_attention_kernel();
}  // namespace keel::adapters
