// ProcessGroupGloo, built against Debian's gloo headers (see c10d_backends.h).
#include <cstdlib>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "c10d/c10d_backends.h"

namespace keel::internal {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const BackendRequest& request) {
  auto options = c10d::ProcessGroupGloo::Options::create(request.timeout);
  // GLOO_SOCKET_IFNAME is the operator's choice of interface, as in
  // torch.distributed; otherwise the address the rendezvous resolved.
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname != nullptr && *ifname != '\0') {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (!request.host.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(request.host));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  options->threads = 2;
  options->group_name = request.group_name;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(request.store, request.rank, request.size,
                                                     options);
}

}  // namespace keel::internal
