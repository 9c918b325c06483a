/// @file keel/v1/error.h
/// @brief keel's error values: `keel::Errc`, `keel::Error`, `keel::result<T>`.
///
/// Every keel call that can fail returns a `keel::result<T>`: either a value
/// or a `keel::Error` whose message names the call, the argument, what was
/// expected and what was given. keel never aborts the process on bad input.
///
/// In one line:
/// `if (auto r = keel::logsumexp(x)) use(r.value()); else log(r.error().to_string());`
///
/// In full:
///
/// @snippet examples/snippets/header_snippets.cpp error_handling
///
/// Callers who prefer exceptions call `.value()` directly: on an error it
/// throws `keel::BadResultAccess`, which carries the `keel::Error`.
///
/// Traps:
/// - `result<T>` is `[[nodiscard]]` (Boost.Outcome marks `basic_result`):
///   ignoring a call's result is a warning (an error under `-Werror`), since
///   an ignored error is a failure nobody sees; drop one on purpose with
///   `(void)call(...);`.
/// - `result<T>` is not a `std::optional`; test it with `if (r)` or
///   `r.has_value()`, and read the error with `r.error()` only when it holds
///   one (`error()` on a value also throws `BadResultAccess`).
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include <boost/outcome/basic_result.hpp>
#include <boost/outcome/policy/base.hpp>

#include "keel/v1/export.h"

namespace keel {
inline namespace v1 {

/// What went wrong, as a stable code a program can branch on.
///
/// Later minor versions may add codes: a `switch` over `Errc` keeps a
/// `default:` (treat an unknown code as `backend_error`).
enum class Errc : std::uint8_t {
  /// The call's arguments are wrong: shape, dtype, device, range or option.
  /// What to do: fix the input; retrying the same call fails the same way.
  invalid_argument = 1,
  /// The call is valid, but no adapter in this build can serve it.
  /// What to do: ask another adapter (`DispatchOptions::backend`), or a
  /// build that has it (the message says what is missing).
  unsupported,
  /// A bounded wait ran out before the operation completed.
  /// What to do: a collective's communicator is aborted, so `reform()`;
  /// elsewhere (creation, a store) retry, perhaps with a longer timeout.
  timeout,
  /// A peer of a collective died or left; the message names its rank.
  /// What to do: `reform()` with the survivors (or wait for a replacement
  /// with `ReformOptions::wait_for_replacements`).
  peer_lost,
  /// The communicator or operation was aborted.
  /// What to do: stop using that communicator; `reform()` makes a new one.
  aborted,
  /// libtorch (or a library below it) failed while serving a valid call.
  /// What to do: report it with the message; retrying rarely helps.
  backend_error,
  /// Reading or writing a file or socket failed.
  /// What to do: check the path, permissions or space; retry may help.
  io_error,
  /// Stored data is truncated, corrupt or not in the expected format.
  /// What to do: record the file again; retrying reads the same bytes.
  corrupt_data,
};

/// The code's name as written in this header, e.g. `"invalid_argument"`.
KEEL_API std::string_view to_string(Errc code) noexcept;

/// An error: a code and a message a person can act on.
class KEEL_API Error {
 public:
  /// An empty `backend_error`; exists because result storage needs a
  /// default. keel never returns one.
  Error() = default;
  /// Makes an error with `code` and `message`.
  Error(Errc code, std::string message) : code_(code), message_(std::move(message)) {}

  /// The code.
  Errc code() const noexcept { return code_; }
  /// The message, which names the call and the argument.
  const std::string& message() const noexcept { return message_; }
  /// `"<code>: <message>"`, for logs.
  std::string to_string() const;

 private:
  Errc code_ = Errc::backend_error;
  std::string message_;
};

/// Thrown by `result<T>::value()` (and `error()`) when the result does not
/// hold what was asked for. It carries the error, if there was one.
class KEEL_API BadResultAccess : public std::exception {
 public:
  /// Wraps `error`; `what()` returns its `to_string()`.
  explicit BadResultAccess(Error error);
  /// `"<code>: <message>"` of the carried error.
  const char* what() const noexcept override { return what_.c_str(); }
  /// The error the result held.
  const Error& error() const noexcept { return error_; }

 private:
  Error error_;
  std::string what_;
};

namespace detail {
[[noreturn]] KEEL_API void throw_bad_result_access(const Error& error);
[[noreturn]] KEEL_API void throw_bad_result_access_no_error();

/// Outcome's no-value policy for keel: wide checks throw BadResultAccess.
struct ThrowBadResultAccess : BOOST_OUTCOME_V2_NAMESPACE::policy::base {
  template <class Impl>
  static constexpr void wide_value_check(Impl&& self) {
    if (!base::_has_value(self)) {
      if (base::_has_error(self)) throw_bad_result_access(base::_error(self));
      throw_bad_result_access_no_error();
    }
  }
  template <class Impl>
  static constexpr void wide_error_check(Impl&& self) {
    if (!base::_has_error(self)) throw_bad_result_access_no_error();
  }
};
}  // namespace detail

/// A value of type `T` or a `keel::Error` (Boost.Outcome's `basic_result`).
/// `result<void>` holds no value on success.
template <class T>
using result = BOOST_OUTCOME_V2_NAMESPACE::basic_result<T, Error, detail::ThrowBadResultAccess>;

/// The success value of a `result<void>`: `return keel::success();`.
inline auto success() noexcept {
  return BOOST_OUTCOME_V2_NAMESPACE::success();
}

}  // namespace v1
}  // namespace keel
