// The native communicator: the collective names each release's c10d offers
// as its newest (docs/torch-api-matrix.md §3). One file per release that
// changed them; CMake compiles the one that fits:
//   comm_2_13.cpp  2.13: all_gather_single, reduce_scatter_single and
//                  all_to_all_single exist on c10d::ProcessGroup only, so the
//                  Backend is wrapped in a ProcessGroup for those three.
//   comm_2_14.cpp  2.14 and later: c10d::Backend itself has them (the old
//                  names became forwarding aliases), so no wrapper.
// Every other collective keeps the name 2.9 has, on c10d::Backend.
#pragma once

#include "dispatch/comm.h"

namespace keel::adapters {

const internal::CommKernel& native_comm_kernel();

}  // namespace keel::adapters
