// PyTorch's Python names for dtypes ("float32", "bfloat16", "int64"), as
// users know them, for messages and reports; c10::toString's names
// ("Float", "BFloat16") for the rest.
#pragma once

#include <string>

#include <ATen/core/TensorBase.h>
#include <c10/core/ScalarType.h>

namespace keel::internal {

std::string dtype_name(c10::ScalarType type);
inline std::string dtype_name(const at::TensorBase& t) {
  return dtype_name(t.scalar_type());
}

}  // namespace keel::internal
