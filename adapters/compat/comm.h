// The compat communicator: adapters/common's BackendEngine as it is, the
// collective names every supported release has.
#pragma once

#include "dispatch/comm.h"

namespace keel::adapters {

const internal::CommKernel& compat_comm_kernel();
// What compat_comm_kernel() calls, in a sentence, for keel-info.
const char* compat_comm_implementation();

}  // namespace keel::adapters
