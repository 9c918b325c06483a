// ProcessGroupNCCL, in CUDA builds (KEEL_WITH_CUDA); the CPU build says why
// it has none.
#include "comm/backends.h"

#ifdef KEEL_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace keel::internal {

#ifdef KEEL_WITH_NCCL
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const BackendRequest& request) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = request.timeout;
  options->group_name = request.group_name;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(request.store, request.rank, request.size,
                                                     options);
}
#else
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const BackendRequest& /*request*/) {
  TORCH_CHECK(false, "keel was built without CUDA (KEEL_WITH_CUDA=OFF): no NCCL");
}
#endif

Support backend_available(comm::CommBackend backend) {
#ifndef KEEL_WITH_NCCL
  if (backend == comm::CommBackend::nccl) {
    return Support::no("this keel was built without CUDA (KEEL_WITH_CUDA=OFF), so without NCCL");
  }
#endif
  (void)backend;
  return Support::yes();
}

std::vector<std::string> comm_devices() {
#ifdef KEEL_WITH_NCCL
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

}  // namespace keel::internal
