#include "dtype_name.h"

namespace keel::internal {

std::string dtype_name(c10::ScalarType type) {
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

}  // namespace keel::internal
