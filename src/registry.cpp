#include "dispatch/registry.h"

namespace keel::internal {

void Registry::add(std::unique_ptr<Adapter> adapter) {
  adapters_.push_back(std::move(adapter));
}

const Adapter* Registry::find(Backend kind) const noexcept {
  for (const auto& adapter : adapters_) {
    if (adapter->kind() == kind) return adapter.get();
  }
  return nullptr;
}

const Registry& Registry::builtin() {
  static const Registry* const registry = [] {
    auto* r = new Registry;  // never destroyed: calls may run during static destruction
    register_builtin_adapters(*r);
    return r;
  }();
  return *registry;
}

}  // namespace keel::internal
