// keel::logsumexp: validation, then dispatch.
#include "keel/v1/logsumexp.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <c10/core/ScalarType.h>

#include "dispatch/logsumexp.h"
#include "dispatcher.h"
#include "guard.h"

namespace keel {
inline namespace v1 {

namespace {

constexpr const char* kOp = "logsumexp";

std::string shape_of(const at::Tensor& t) {
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

result<std::int64_t> validate(const at::Tensor& input, const LogsumexpOptions& options) {
  if (!input.defined()) {
    return Error(Errc::invalid_argument, "logsumexp: input is an undefined tensor");
  }
  const at::ScalarType dtype = input.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble && dtype != at::kHalf && dtype != at::kBFloat16) {
    return Error(Errc::invalid_argument,
                 absl::StrCat("logsumexp: input has dtype ", c10::toString(dtype),
                              "; expected float16, bfloat16, float32 or float64"));
  }
  const std::int64_t rank = input.dim();
  if (rank == 0) {
    return Error(Errc::invalid_argument,
                 "logsumexp: input is a 0-dimensional tensor; expected at least one dimension");
  }
  if (options.dim < -rank || options.dim >= rank) {
    return Error(
        Errc::invalid_argument,
        absl::StrCat("logsumexp: options.dim is ", options.dim, ", out of range for input ",
                     shape_of(input), " (expected ", -rank, " <= dim < ", rank, ")"));
  }
  const at::Tensor& mask = options.mask;
  if (mask.defined()) {
    if (mask.scalar_type() != at::kBool) {
      return Error(Errc::invalid_argument, absl::StrCat("logsumexp: options.mask has dtype ",
                                                        c10::toString(mask.scalar_type()),
                                                        "; expected bool (true keeps an entry)"));
    }
    if (mask.device() != input.device()) {
      return Error(Errc::invalid_argument,
                   absl::StrCat("logsumexp: options.mask is on ", mask.device().str(),
                                " but input is on ", input.device().str()));
    }
    bool broadcastable = mask.dim() <= rank;
    for (std::int64_t i = 1; broadcastable && i <= mask.dim(); ++i) {
      const std::int64_t m = mask.size(-i);
      broadcastable = m == 1 || m == input.size(-i);
    }
    if (!broadcastable) {
      return Error(Errc::invalid_argument,
                   absl::StrCat("logsumexp: options.mask has shape ", shape_of(mask),
                                ", which does not broadcast to input's ", shape_of(input)));
    }
  }
  return options.dim < 0 ? options.dim + rank : options.dim;
}

}  // namespace

result<LogsumexpOutput> logsumexp(const at::Tensor& input, const LogsumexpOptions& options) {
  result<std::int64_t> dim = validate(input, options);
  if (!dim) return dim.error();
  result<internal::Request> request = internal::resolve_request(options.dispatch);
  if (!request) return request.error();

  const internal::LogsumexpCall call{input, options.mask, dim.value(), options.keepdim};
  auto selection = internal::select(internal::Registry::builtin(), kOp, request.value(), call,
                                    &internal::Adapter::logsumexp);
  if (!selection) return selection.error();

  const internal::LogsumexpKernel* kernel = selection.value().kernel;
  result<at::Tensor> value =
      internal::guarded(kOp, selection.value().info.adapter, [&] { return kernel->run(call); });
  if (!value) return value.error();
  return LogsumexpOutput{std::move(value).value(), std::move(selection).value().info};
}

}  // namespace v1
}  // namespace keel
