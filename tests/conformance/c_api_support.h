// What the C ABI's conformance tests share: this build's plugin, loaded
// once by the loader, and a bitwise comparison of two tensors (on any
// device).
#pragma once

#include <cstring>
#include <stdexcept>
#include <utility>

#include <ATen/ATen.h>

#include "keel/c/keel.hpp"

namespace keel::testing {

inline const keel::c::Plugin& this_plugin() {
  static const keel::c::Plugin p = [] {
    keel::c::LoadOptions o;
    o.plugin_path = KEEL_PLUGIN_FILE;
    keel::c::Result<keel::c::Plugin> r = keel::c::Plugin::load(o);
    if (!r) throw std::runtime_error(r.error().message());
    return std::move(r).value();
  }();
  return p;
}

// Equal dtypes, shapes and bytes; two undefined tensors are equal.
inline bool bitwise(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.cpu().contiguous(), y = b.cpu().contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

}  // namespace keel::testing
