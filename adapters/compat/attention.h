// The attention kernel of the compat adapter: dense calls SDPA computes
// exactly go to at::scaled_dot_product_attention, the rest to
// compat::block_sparse_attention (DispatchInfo::reason says which, and why).
#pragma once

#include "dispatch/attention.h"
#include "keel/v1/build_info.h"

namespace keel::adapters {

const internal::AttentionKernel& compat_attention_kernel();

// What the compat attention kernel serves, for keel-info.
CapabilityInfo attention_capability();

}  // namespace keel::adapters
