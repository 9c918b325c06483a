// The attention kernel of the native adapter.
#pragma once

#include "dispatch/attention.h"

namespace keel::adapters {

const internal::AttentionKernel& native_attention_kernel();

}  // namespace keel::adapters
