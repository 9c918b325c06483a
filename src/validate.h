// The core's validation toolkit: the checks and message builders that every
// operation's validation shares (attention, logsumexp, linear_cross_entropy,
// comm), written once so that their messages read alike.
#pragma once

#include <string>
#include <string_view>

#include <ATen/core/TensorBase.h>
#include <c10/core/ScalarType.h>

#include "keel/v1/error.h"

namespace keel::internal {

// The floating dtypes keel computes in, as a message names them.
inline constexpr const char* kSupportedFloats = "float16, bfloat16, float32 or float64";

// "[2, 3, 4]".
std::string shape_text(c10::IntArrayRef sizes);
inline std::string shape_text(const at::TensorBase& t) {
  return shape_text(t.sizes());
}

// Whether `t` is one of kSupportedFloats.
bool is_supported_float(c10::ScalarType t) noexcept;

// Whether `t` broadcasts to `shape` (numpy rules: trailing dims equal or 1).
bool broadcasts_to(const at::TensorBase& t, c10::IntArrayRef shape) noexcept;

// Errc::invalid_argument, "<op>: <message>".
Error invalid(std::string_view op, std::string_view message);

// `t` is on `ref`'s device; else invalid_argument naming both.
result<void> check_same_device(std::string_view op, std::string_view name, const at::TensorBase& t,
                               std::string_view ref_name, const at::TensorBase& ref);

}  // namespace keel::internal
