/// @file keel/v1/dtype.h
/// @brief `keel::dtype_name`: the names keel gives dtypes in its messages,
/// reports and capabilities.
///
/// keel names a dtype as PyTorch's Python does ("float32", "bfloat16",
/// "int64"), the names users know, wherever it shows one: an error message,
/// `CapabilityInfo::dtypes`, a keel-compat report. Any other dtype gets
/// c10's own name ("ComplexFloat").
///
/// In one line:
/// `keel::dtype_name(at::kBFloat16)` is `"bfloat16"`.
///
/// In full:
///
/// @snippet examples/snippets/header_snippets.cpp dtype_name
#pragma once

#include <string>

#include <ATen/core/TensorBase.h>
#include <c10/core/ScalarType.h>

namespace keel {
inline namespace v1 {

/// The name keel gives `type`: PyTorch's Python name for the floating,
/// integer and boolean dtypes, else c10's own.
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

/// The name keel gives the dtype of `t`.
inline std::string dtype_name(const at::TensorBase& t) {
  return dtype_name(t.scalar_type());
}

}  // namespace v1
}  // namespace keel
