// The compat communicator: adapters/c10d's C10dEngine as it is, the
// collective names every supported release has.
#pragma once

#include "dispatch/comm.h"

namespace keel::adapters {

const internal::CommKernel& compat_comm_kernel();

}  // namespace keel::adapters
