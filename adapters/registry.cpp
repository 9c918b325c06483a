// The adapters this build compiled, compat first. CMake compiles
// adapters/native only against libtorch >= 2.13 and then defines
// KEEL_HAS_NATIVE_ADAPTER on this file.
#include "dispatch/registry.h"
#include "compat/compat_adapter.h"
#ifdef KEEL_HAS_NATIVE_ADAPTER
#include "native/native_adapter.h"
#endif

namespace keel::internal {

void register_builtin_adapters(Registry& registry) {
  registry.add(adapters::make_compat_adapter());
#ifdef KEEL_HAS_NATIVE_ADAPTER
  registry.add(adapters::make_native_adapter());
#endif
}

}  // namespace keel::internal
