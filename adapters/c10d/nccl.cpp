// ProcessGroupNCCL, in CUDA builds (KEEL_WITH_CUDA); the CPU build says why
// it has none. Also what both backends share: choosing one, and reading
// their failures.
#include "c10d/c10d_backends.h"

#include <absl/strings/match.h>

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

c10::intrusive_ptr<c10d::Backend> make_backend(const BackendRequest& request) {
  return request.backend == comm::CommBackend::nccl ? make_nccl_backend(request)
                                                    : make_gloo_backend(request);
}

Errc classify_c10d_failure(const std::string& text) noexcept {
  if (absl::StrContains(text, "imed out") || absl::StrContains(text, "imeout"))
    return Errc::timeout;
  if (absl::StrContains(text, "Connection reset") || absl::StrContains(text, "Connection closed") ||
      absl::StrContains(text, "Broken pipe") || absl::StrContains(text, "Read error") ||
      absl::StrContains(text, "Write error") || absl::StrContains(text, "ECONNRESET") ||
      absl::StrContains(text, "closed by peer")) {
    return Errc::peer_lost;
  }
  return Errc::backend_error;
}

std::vector<c10::DeviceType> comm_devices() {
#ifdef KEEL_WITH_NCCL
  return {c10::DeviceType::CPU, c10::DeviceType::CUDA};
#else
  return {c10::DeviceType::CPU};
#endif
}

}  // namespace keel::internal
