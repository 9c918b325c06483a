// The facts CMake knows about this build (KEEL_BUILD_TORCH_VERSION,
// KEEL_BUILD_CUDA, KEEL_BUILD_COMPILER, KEEL_BUILD_TYPE,
// KEEL_BUILD_CXX_STANDARD, KEEL_BUILD_SUPPORTED_TORCH, a space-separated
// list, and KEEL_BUILD_TORCH_SUPPORT) arrive as
// definitions on this one file (see CMakeLists.txt), so that no public
// header depends on them.
#include "keel/v1/build_info.h"

#include <sstream>

#include "dispatch/attention.h"
#include "dispatch/comm.h"
#include "dispatch/linear_cross_entropy.h"
#include "dispatch/logsumexp.h"
#include "dispatch/registry.h"
#include "keel/version.h"

namespace keel {
inline namespace v1 {

const char* version() noexcept {
  return KEEL_VERSION_STRING;
}

namespace {

// An adapter as keel-info shows it: each kernel's own Capability, in the
// order of the operations' headers.
AdapterInfo describe(const internal::Adapter& adapter) {
  AdapterInfo info;
  info.name = std::string(to_string(adapter.kind()));
  info.description = adapter.description();
  if (const auto* k = adapter.logsumexp()) info.capabilities.push_back(k->capability().info());
  if (const auto* k = adapter.linear_cross_entropy()) {
    info.capabilities.push_back(k->capability().info());
  }
  if (const auto* k = adapter.attention()) info.capabilities.push_back(k->capability().info());
  if (const auto* k = adapter.comm()) info.capabilities.push_back(k->capability().info());
  return info;
}

}  // namespace

const BuildInfo& build_info() {
  static const BuildInfo info = [] {
    BuildInfo b;
    b.keel_version = KEEL_VERSION_STRING;
    b.torch_version = KEEL_BUILD_TORCH_VERSION;
    b.cuda = KEEL_BUILD_CUDA != 0;
    b.compiler = KEEL_BUILD_COMPILER;
    b.build_type = KEEL_BUILD_TYPE;
    b.cxx_standard = KEEL_BUILD_CXX_STANDARD;
    std::istringstream releases(KEEL_BUILD_SUPPORTED_TORCH);
    for (std::string r; releases >> r;) b.supported_torch.push_back(r);
    b.torch_support = KEEL_BUILD_TORCH_SUPPORT;
    for (const auto& adapter : internal::Registry::builtin().adapters()) {
      b.adapters.push_back(describe(*adapter));
    }
    return b;
  }();
  return info;
}

}  // namespace v1
}  // namespace keel
