// keel::logsumexp: validation, then dispatch.
#include "keel/v1/logsumexp.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <c10/core/ScalarType.h>

#include "dispatch/logsumexp.h"
#include "dispatcher.h"
#include "keel/v1/dtype.h"
#include "validate.h"

namespace keel {
inline namespace v1 {

namespace {

constexpr const char* kOp = "logsumexp";

result<std::int64_t> validate(const at::Tensor& input, const LogsumexpOptions& options) {
  if (!input.defined()) return internal::invalid(kOp, "input is an undefined tensor");
  if (!internal::is_supported_float(input.scalar_type())) {
    return internal::invalid(kOp, absl::StrCat("input has dtype ", keel::dtype_name(input),
                                               "; expected ", internal::kSupportedFloats));
  }
  const std::int64_t rank = input.dim();
  if (rank == 0) {
    return internal::invalid(kOp,
                             "input is a 0-dimensional tensor; expected at least one dimension");
  }
  if (options.dim < -rank || options.dim >= rank) {
    return internal::invalid(
        kOp,
        absl::StrCat("options.dim is ", options.dim, ", out of range for input ",
                     internal::shape_text(input), " (expected ", -rank, " <= dim < ", rank, ")"));
  }
  const at::Tensor& mask = options.mask;
  if (mask.defined()) {
    if (mask.scalar_type() != at::kBool) {
      return internal::invalid(kOp, absl::StrCat("options.mask has dtype ", keel::dtype_name(mask),
                                                 "; expected bool (true keeps an entry)"));
    }
    result<void> device = internal::check_same_device(kOp, "options.mask", mask, "input", input);
    if (!device) return device.error();
    if (!internal::broadcasts_to(mask, input.sizes())) {
      return internal::invalid(
          kOp, absl::StrCat("options.mask has shape ", internal::shape_text(mask),
                            ", which does not broadcast to input's ", internal::shape_text(input)));
    }
  }
  return options.dim < 0 ? options.dim + rank : options.dim;
}

}  // namespace

result<LogsumexpOutput> logsumexp(const at::Tensor& input, const LogsumexpOptions& options) {
  result<std::int64_t> dim = validate(input, options);
  if (!dim) return dim.error();
  const internal::LogsumexpCall call{input, options.mask, dim.value(), options.keepdim};
  auto ran = internal::dispatch_and_run(kOp, options.dispatch, call, &internal::Adapter::logsumexp);
  if (!ran) return ran.error();
  return LogsumexpOutput{std::move(ran.value().value), std::move(ran.value().info)};
}

}  // namespace v1
}  // namespace keel
