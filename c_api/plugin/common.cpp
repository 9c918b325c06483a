#include "common.h"

namespace keel::c_api {

KEEL_Error* out_of_memory() noexcept {
  static KEEL_Error error{KEEL_ERRC_BACKEND_ERROR, "keel: out of memory"};
  return &error;
}

KEEL_Error* make_error(std::int32_t code, std::string message) noexcept {
  try {
    return new KEEL_Error{code, std::move(message)};
  } catch (...) {
    return out_of_memory();
  }
}

KEEL_Error* to_c(const Error& e) {
  return make_error(static_cast<std::int32_t>(e.code()), e.message());
}

result<Backend> backend_of(std::int32_t b, const std::string& name) {
  switch (b) {
    case KEEL_BACKEND_UNSET:
      return Backend::unset;
    case KEEL_BACKEND_AUTOMATIC:
      return Backend::automatic;
    case KEEL_BACKEND_COMPAT:
      return Backend::compat;
    case KEEL_BACKEND_NATIVE:
      return Backend::native;
    default:
      break;
  }
  return Error(Errc::invalid_argument, name + " is " + std::to_string(b) + ", not a KEEL_Backend");
}

std::int32_t served(const DispatchInfo& d) {
  switch (d.served) {
    case Backend::native:
      return KEEL_BACKEND_NATIVE;
    case Backend::compat:
      return KEEL_BACKEND_COMPAT;
    default:
      return KEEL_BACKEND_AUTOMATIC;
  }
}

result<CausalAlignment> alignment_of(std::int32_t a, const std::string& name) {
  if (a == KEEL_ALIGN_TOP_LEFT) return CausalAlignment::top_left;
  if (a == KEEL_ALIGN_BOTTOM_RIGHT) return CausalAlignment::bottom_right;
  return Error(Errc::invalid_argument,
               name + " is " + std::to_string(a) + ", not a KEEL_Alignment");
}

}  // namespace keel::c_api
