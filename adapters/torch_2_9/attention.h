// The attention kernel of the compat adapter, and the route it takes, which
// the native adapter shares while libtorch adds no attention path of its own.
#pragma once

#include "dispatch/attention.h"
#include "keel/v1/build_info.h"

namespace keel::adapters {

// Dense calls SDPA computes exactly go to at::scaled_dot_product_attention;
// the rest to compat::block_sparse_attention. `path` says which, and why.
internal::AttentionResult compat_attention_route(const internal::AttentionCall& call);

const internal::AttentionKernel& compat_attention_kernel();

// What the compat attention route serves; the native adapter shares it.
CapabilityInfo attention_capability();

}  // namespace keel::adapters
