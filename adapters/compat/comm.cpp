#include "compat/comm.h"

#include "c10d/c10d_engine.h"

namespace keel::adapters {

const internal::CommKernel& compat_comm_kernel() {
  static const C10dEngineComm<C10dEngine> kernel(
      "c10d::Backend with the names 2.9 has (_allgather_base, _reduce_scatter_base, "
      "alltoall_base)");
  return kernel;
}

}  // namespace keel::adapters
