// The adapters of this build. The built-in registry is filled once, by
// adapters/registry.cpp, with compat first; tests build their own registries
// from fake adapters to exercise the dispatcher.
#pragma once

#include <memory>
#include <vector>

#include "dispatch/adapter.h"

namespace keel::internal {

class Registry {
 public:
  void add(std::unique_ptr<Adapter> adapter);

  // The adapter of that kind, or nullptr when this build has none.
  const Adapter* find(Backend kind) const noexcept;
  const std::vector<std::unique_ptr<Adapter>>& adapters() const noexcept { return adapters_; }

  // The adapters compiled into this build; built on first use, thread-safe.
  static const Registry& builtin();

 private:
  std::vector<std::unique_ptr<Adapter>> adapters_;
};

// Defined in adapters/registry.cpp: adds every adapter this build compiled.
void register_builtin_adapters(Registry& registry);

}  // namespace keel::internal
