// The native adapter: paths that libtorch 2.13 offers in C++ and 2.9 does
// not (docs/torch-api-matrix.md), for the calls they serve exactly.
// Compiled only against libtorch >= 2.13.
#pragma once

#include <memory>

#include "dispatch/adapter.h"

namespace keel::adapters {

std::unique_ptr<internal::Adapter> make_native_adapter();

}  // namespace keel::adapters
