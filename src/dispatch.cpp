// Backend names, the process default, request resolution and the choice
// between compat and native.
#include <atomic>

#include <absl/strings/ascii.h>
#include <absl/strings/str_cat.h>

#include "diagnostics.h"
#include "dispatcher.h"
#include "environment.h"
#include "keel/v1/dispatch.h"
#include "string_view_bridge.h"

namespace keel {
inline namespace v1 {

namespace {
std::atomic<Backend> process_default{Backend::unset};
constexpr const char* kValidBackends = "'auto', 'compat' or 'native'";
}  // namespace

std::string_view to_string(Backend backend) noexcept {
  switch (backend) {
    case Backend::unset:
      return "unset";
    case Backend::automatic:
      return "auto";
    case Backend::compat:
      return "compat";
    case Backend::native:
      return "native";
  }
  return "invalid";
}

std::string_view to_string(AttentionRoute route) noexcept {
  switch (route) {
    case AttentionRoute::none:
      return "none";
    case AttentionRoute::dense:
      return "dense";
    case AttentionRoute::block_sparse:
      return "block_sparse";
    case AttentionRoute::decode:
      return "decode";
    case AttentionRoute::paged:
      return "paged";
    case AttentionRoute::gathered_paged:
      return "gathered_paged";
  }
  return "invalid";
}

result<Backend> parse_backend(std::string_view text) {
  const absl::string_view name = absl::StripAsciiWhitespace(internal::to_absl(text));
  if (name == "auto") return Backend::automatic;
  if (name == "compat") return Backend::compat;
  if (name == "native") return Backend::native;
  return Error(Errc::invalid_argument,
               absl::StrCat("backend: '", internal::to_absl(text), "' is not a backend; expected ",
                            kValidBackends));
}

void set_default_backend(Backend backend) noexcept {
  process_default.store(backend);
}

Backend default_backend() noexcept {
  const Backend b = process_default.load();
  return b == Backend::unset ? Backend::automatic : b;
}

}  // namespace v1

namespace internal {

result<Request> resolve_request(const DispatchOptions& options) {
  switch (options.backend) {
    case Backend::unset:
      break;
    case Backend::automatic:
    case Backend::compat:
    case Backend::native:
      return Request{options.backend, "call"};
    default:
      return Error(Errc::invalid_argument,
                   absl::StrCat("dispatch.backend: value ", static_cast<int>(options.backend),
                                " is not a keel::Backend"));
  }
  if (const std::optional<std::string> env = environment_value("KEEL_BACKEND")) {
    result<Backend> parsed = parse_backend(*env);
    if (!parsed) {
      return Error(Errc::invalid_argument,
                   absl::StrCat("KEEL_BACKEND='", *env, "' is not a backend; set it to ",
                                kValidBackends, ", or unset it"));
    }
    return Request{parsed.value(), "KEEL_BACKEND"};
  }
  const Backend process = process_default.load();
  if (process != Backend::unset) return Request{process, "process default"};
  return Request{Backend::automatic, "built-in default"};
}

namespace {

DispatchInfo make_info(Backend served, const Request& request, std::string reason) {
  DispatchInfo info;
  info.adapter = std::string(to_string(served));
  info.served = served;
  info.requested = request.backend;
  info.requested_by = request.source;
  info.reason = std::move(reason);
  return info;
}

// The decision itself, before it is logged: which adapter serves, or why
// none does.
result<DispatchInfo> pick_adapter(std::string_view op, const Request& request,
                                  const Candidate& compat, const Candidate& native) {
  const auto native_unavailable = [&]() -> std::string {
    if (native.adapter == nullptr) {
      return "this build has no native adapter (keel was built against libtorch " +
             build_info().torch_version + "; native paths need 2.13 or later)";
    }
    if (!native.has_kernel) return absl::StrCat("the native adapter does not offer ", to_absl(op));
    return native.support.reason;
  };
  const bool native_serves = native.adapter != nullptr && native.has_kernel && native.support.ok;

  switch (request.backend) {
    case Backend::native:
      if (native_serves)
        return make_info(Backend::native, request, "native requested, and it serves the call");
      return Error(Errc::unsupported,
                   absl::StrCat(to_absl(op), ": native requested (by ", request.source, "), but ",
                                native_unavailable()));
    case Backend::compat:
      if (compat.has_kernel && compat.support.ok) {
        return make_info(Backend::compat, request, "compat requested");
      }
      return Error(Errc::unsupported,
                   absl::StrCat(to_absl(op), ": compat requested (by ", request.source, "), but ",
                                compat.has_kernel ? compat.support.reason
                                                  : "the compat adapter does not offer it"));
    default:
      if (native_serves)
        return make_info(Backend::native, request, "auto: native serves the whole call");
      if (compat.has_kernel && compat.support.ok) {
        return make_info(Backend::compat, request, absl::StrCat("auto: ", native_unavailable()));
      }
      return Error(
          Errc::unsupported,
          absl::StrCat(
              to_absl(op), ": no adapter serves this call: native: ", native_unavailable(),
              "; compat: ", compat.has_kernel ? compat.support.reason : "does not offer it"));
  }
}

}  // namespace

result<DispatchInfo> decide(std::string_view operation, const Request& request,
                            const Candidate& compat, const Candidate& native) {
  result<DispatchInfo> info = pick_adapter(operation, request, compat, native);
  if (log_enabled("dispatch")) {
    if (info) {
      log_line("dispatch", absl::StrCat(to_absl(operation), " -> ", info.value().adapter,
                                        " (requested ", to_absl(to_string(request.backend)), " by ",
                                        request.source, "; ", info.value().reason, ")"));
    } else {
      log_line("dispatch", absl::StrCat(to_absl(operation), " -> error: ", info.error().message()));
    }
  }
  return info;
}

}  // namespace internal
}  // namespace keel
