// The native communicator: PyTorch 2.13's torchcomms-style names on
// c10d::ProcessGroup (all_gather_single, reduce_scatter_single,
// all_to_all_single; docs/torch-api-matrix.md §3.2). c10d::Backend keeps the
// old names in 2.13, so the collectives 2.13 did not rename stay on it.
#pragma once

#include "dispatch/comm.h"

namespace keel::adapters {

const internal::CommKernel& native_comm_kernel();

}  // namespace keel::adapters
