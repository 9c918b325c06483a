#include "keel/v1/error.h"

#include <absl/strings/str_cat.h>

namespace keel {
inline namespace v1 {

std::string_view to_string(Errc code) noexcept {
  switch (code) {
    case Errc::invalid_argument:
      return "invalid_argument";
    case Errc::unsupported:
      return "unsupported";
    case Errc::timeout:
      return "timeout";
    case Errc::peer_lost:
      return "peer_lost";
    case Errc::aborted:
      return "aborted";
    case Errc::backend_error:
      return "backend_error";
    case Errc::io_error:
      return "io_error";
    case Errc::corrupt_data:
      return "corrupt_data";
  }
  return "unknown";
}

std::string Error::to_string() const {
  const std::string_view name = keel::to_string(code_);
  return absl::StrCat(absl::string_view(name.data(), name.size()), ": ", message_);
}

BadResultAccess::BadResultAccess(Error error)
    : error_(std::move(error)), what_(error_.to_string()) {}

namespace detail {
void throw_bad_result_access(const Error& error) {
  throw BadResultAccess(error);
}
void throw_bad_result_access_no_error() {
  throw BadResultAccess(
      Error(Errc::invalid_argument, "result: error() was called on a result that holds a value"));
}
}  // namespace detail

}  // namespace v1
}  // namespace keel
