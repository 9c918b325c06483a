// Making c10d backends. ProcessGroupGloo's header needs gloo's headers,
// which the torch wheels do not ship: keel compiles src/comm/gloo.cpp
// against Debian's libgloo-dev headers (unpacked by scripts/fetch-deps.sh,
// never linked; the gloo code is the copy inside libtorch_cpu). keel only
// passes gloo objects through as the opaque pointers libtorch hands out,
// and tests/unit/gloo_layout_test.cpp proves the class layouts agree.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dispatch/adapter.h"
#include "keel/v1/comm.h"

namespace keel::internal {

struct BackendRequest {
  c10::intrusive_ptr<c10d::Store> store;  // already prefixed for this group
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  std::string host;  // the address peers reach this rank at (Gloo)
  c10::Device device = c10::kCPU;
  std::string group_name;
};

// May throw (c10::Error): the core guards it.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const BackendRequest& request);
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const BackendRequest& request);

// Whether this build carries `backend` (NCCL needs KEEL_WITH_CUDA).
Support backend_available(comm::CommBackend backend);
// "cpu", and "cuda" in a CUDA build.
std::vector<std::string> comm_devices();

}  // namespace keel::internal
