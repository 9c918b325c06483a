#include "validate.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>

#include "string_view_bridge.h"

namespace keel::internal {

std::string shape_text(c10::IntArrayRef sizes) {
  return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]");
}

bool is_supported_float(c10::ScalarType t) noexcept {
  return t == c10::kFloat || t == c10::kDouble || t == c10::kHalf || t == c10::kBFloat16;
}

bool broadcasts_to(const at::TensorBase& t, c10::IntArrayRef shape) noexcept {
  const auto rank = static_cast<std::int64_t>(shape.size());
  if (t.dim() > rank) return false;
  for (std::int64_t i = 1; i <= t.dim(); ++i) {
    const std::int64_t s = t.size(-i);
    if (s != 1 && s != shape[rank - i]) return false;
  }
  return true;
}

Error invalid(std::string_view op, std::string_view message) {
  return {Errc::invalid_argument, absl::StrCat(to_absl(op), ": ", to_absl(message))};
}

result<void> check_same_device(std::string_view op, std::string_view name, const at::TensorBase& t,
                               std::string_view ref_name, const at::TensorBase& ref) {
  if (t.device() == ref.device()) return success();
  return invalid(op, absl::StrCat(to_absl(name), " is on ", t.device().str(), " but ",
                                  to_absl(ref_name), " is on ", ref.device().str()));
}

}  // namespace keel::internal
