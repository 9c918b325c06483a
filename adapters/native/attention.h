// The attention kernel of the native adapter, which serves nothing: no
// release offers a C++ attention path of its own (attention.cpp says why).
#pragma once

#include "dispatch/attention.h"

namespace keel::adapters {

// Declines every call: its Capability serves nothing, and says why.
const internal::AttentionKernel& native_attention_kernel();

}  // namespace keel::adapters
