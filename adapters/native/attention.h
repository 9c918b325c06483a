// The attention kernel of the native adapter, which serves nothing: no
// release offers a C++ attention path of its own (attention.cpp says why).
#pragma once

#include "dispatch/attention.h"

namespace keel::adapters {

// Declines every call, with native_attention_refusal() as the reason.
const internal::AttentionKernel& native_attention_kernel();
const char* native_attention_refusal();

}  // namespace keel::adapters
