// Making c10d backends, shared by every adapter (adapters/c10d/ is the
// adapters' own library: the core never includes it). ProcessGroupGloo's
// header needs gloo's headers, which the torch wheels do not ship: keel
// compiles gloo.cpp against Debian's libgloo-dev headers (unpacked by
// scripts/fetch-deps.sh, never linked; the gloo code is the copy inside
// libtorch_cpu). keel only passes gloo objects through as the opaque
// pointers libtorch hands out, and tests/unit/gloo_layout_test.cpp proves
// the class layouts agree.
#pragma once

#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "dispatch/comm.h"

namespace keel::internal {

// May throw (c10::Error): the core guards CommKernel::create.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const BackendRequest& request);
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const BackendRequest& request);
// The one `request.backend` names.
c10::intrusive_ptr<c10d::Backend> make_backend(const BackendRequest& request);

// Whether this build carries `backend` (NCCL needs KEEL_WITH_CUDA).
Support backend_available(comm::CommBackend backend);
// CPU, and CUDA in a build with NCCL.
std::vector<c10::DeviceType> comm_devices();

// CommKernel::classify_failure as Gloo and NCCL word their failures in
// every supported release (2.9 to 2.15): "Timed out"/"timeout" is a
// timeout; a reset, closed or broken connection is a lost peer; anything
// else is the backend's own error.
Errc classify_c10d_failure(const std::string& text) noexcept;

}  // namespace keel::internal
