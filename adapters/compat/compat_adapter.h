// The compat adapter: every capability, on APIs present in libtorch 2.9 and
// keel's own shims in kernels/. Compiled into every build.
#pragma once

#include <memory>

#include "dispatch/adapter.h"
#include "keel/v1/build_info.h"

namespace keel::adapters {

std::unique_ptr<internal::Adapter> make_compat_adapter();

}  // namespace keel::adapters
