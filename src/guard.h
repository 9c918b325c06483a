// The adapter boundary: libtorch reports failure by throwing (c10::Error and
// friends); keel's callers get a keel::Error instead, never an exception.
#pragma once

#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <absl/strings/str_cat.h>
#include <c10/util/Exception.h>

#include "keel/v1/error.h"
#include "string_view_bridge.h"

namespace keel::internal {

// A keel::Error thrown through code that reports failure by exception (a
// callback inside an adapter's kernel, an autograd backward), so that
// guarded() returns it as it was, code and message. What a caller sees
// when it escapes (from backward()) is the error's to_string().
class ErrorException : public std::runtime_error {
 public:
  explicit ErrorException(Error error)
      : std::runtime_error(error.to_string()), error_(std::move(error)) {}
  const Error& error() const noexcept { return error_; }

 private:
  Error error_;
};

template <class F>
auto guarded(std::string_view operation, std::string_view adapter, F&& f) -> result<decltype(f())> {
  try {
    return f();
  } catch (const ErrorException& e) {
    return e.error();
  } catch (const c10::Error& e) {
    return Error(Errc::backend_error,
                 absl::StrCat(to_absl(operation), ": libtorch failed in the ", to_absl(adapter),
                              " adapter: ", e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    return Error(Errc::backend_error, absl::StrCat(to_absl(operation), ": out of memory in the ",
                                                   to_absl(adapter), " adapter"));
  } catch (const std::exception& e) {
    return Error(Errc::backend_error, absl::StrCat(to_absl(operation), ": failed in the ",
                                                   to_absl(adapter), " adapter: ", e.what()));
  } catch (...) {
    return Error(Errc::backend_error,
                 absl::StrCat(to_absl(operation), ": unknown exception in the ", to_absl(adapter),
                              " adapter"));
  }
}

}  // namespace keel::internal
