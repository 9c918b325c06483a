// PyTorch's Python names for dtypes ("float32", "bfloat16", "int64"), as
// users know them, for messages, reports and keel-info; c10::toString's
// names ("Float", "BFloat16") for the rest. In the contract, so that the
// core and the adapters name a dtype alike.
#pragma once

#include <string>

#include <ATen/core/TensorBase.h>
#include <c10/core/ScalarType.h>

namespace keel::internal {

inline std::string dtype_name(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat:
      return "float32";
    case c10::kDouble:
      return "float64";
    case c10::kHalf:
      return "float16";
    case c10::kBFloat16:
      return "bfloat16";
    case c10::kLong:
      return "int64";
    case c10::kInt:
      return "int32";
    case c10::kShort:
      return "int16";
    case c10::kChar:
      return "int8";
    case c10::kByte:
      return "uint8";
    case c10::kBool:
      return "bool";
    default:
      return {c10::toString(type)};
  }
}

inline std::string dtype_name(const at::TensorBase& t) {
  return dtype_name(t.scalar_type());
}

}  // namespace keel::internal
