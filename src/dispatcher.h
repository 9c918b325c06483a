// Choosing the adapter for one call: resolve the request (call, then
// KEEL_BACKEND, then the process default), then ask the adapters' kernels
// whether they can serve it. Records the decision in DispatchInfo and, under
// KEEL_LOG=dispatch, in the log.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "dispatch/adapter.h"
#include "dispatch/registry.h"
#include "guard.h"
#include "keel/v1/dispatch.h"
#include "keel/v1/error.h"

namespace keel::internal {

// The backend a call asks for, after the precedence rules, and who asked.
struct Request {
  Backend backend = Backend::automatic;
  const char* source = "built-in default";
};

// Fails with invalid_argument on an unknown KEEL_BACKEND or an out-of-range
// per-call value.
result<Request> resolve_request(const DispatchOptions& options);

template <class Kernel>
struct Selection {
  const Kernel* kernel = nullptr;
  DispatchInfo info;
};

// One candidate as the dispatcher sees it: the adapter's kernel (or null)
// and its answer for this call.
struct Candidate {
  const Adapter* adapter = nullptr;
  bool has_kernel = false;
  Support support;
};

// The non-template half of select(): picks among compat and native and
// writes DispatchInfo, or says why neither serves.
result<DispatchInfo> decide(std::string_view operation, const Request& request,
                            const Candidate& compat, const Candidate& native);

template <class Kernel, class Call>
result<Selection<Kernel>> select(const Registry& registry, std::string_view operation,
                                 const Request& request, const Call& call,
                                 const Kernel* (Adapter::*kernel_of)() const noexcept) {
  auto candidate = [&](Backend kind, const Kernel** kernel) {
    Candidate c;
    c.adapter = registry.find(kind);
    *kernel = c.adapter != nullptr ? (c.adapter->*kernel_of)() : nullptr;
    c.has_kernel = *kernel != nullptr;
    if (c.has_kernel) c.support = (*kernel)->supports(call);
    return c;
  };
  const Kernel* compat_kernel = nullptr;
  const Kernel* native_kernel = nullptr;
  // Native is asked only when it could be chosen: its supports() may cost.
  const Candidate compat = candidate(Backend::compat, &compat_kernel);
  const Candidate native = request.backend == Backend::compat
                               ? Candidate{registry.find(Backend::native), false, {}}
                               : candidate(Backend::native, &native_kernel);
  auto info = decide(operation, request, compat, native);
  if (!info) return info.error();
  Selection<Kernel> selection;
  selection.kernel = info.value().served == Backend::native ? native_kernel : compat_kernel;
  selection.info = std::move(info).value();
  return selection;
}

// What a kernel computed, and the decision that chose its adapter.
template <class Value>
struct Dispatched {
  Value value;
  DispatchInfo info;
};

// The tail every operation shares once its call is validated: resolve the
// request, select the adapter, and run its kernel with whatever libtorch
// throws turned into a keel::Error.
template <class Kernel, class Call>
auto dispatch_and_run(std::string_view operation, const DispatchOptions& options, const Call& call,
                      const Kernel* (Adapter::*kernel_of)() const noexcept)
    -> result<Dispatched<decltype(std::declval<const Kernel&>().run(call))>> {
  result<Request> request = resolve_request(options);
  if (!request) return request.error();
  auto selection = select(Registry::builtin(), operation, request.value(), call, kernel_of);
  if (!selection) return selection.error();
  const Kernel* kernel = selection.value().kernel;
  auto value =
      guarded(operation, selection.value().info.adapter, [&] { return kernel->run(call); });
  if (!value) return value.error();
  return Dispatched<decltype(kernel->run(call))>{std::move(value).value(),
                                                 std::move(selection).value().info};
}

}  // namespace keel::internal
