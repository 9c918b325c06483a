// A keel plugin: keel::v1 behind the C ABI's function table
// (include/keel/c/keel.h). Sees only the public headers: every call is the
// keel::v1 call of the same release, so the numbers are the same, bitwise.
//
// This room holds what is the plugin's own: its note, errors, build
// information and capabilities, and the table. The calls live beside it, one
// room per section of the header (attention.cpp, loss.cpp, comm.cpp,
// compat.cpp). Every entry point is noexcept: it copies the caller's
// argument struct into a zeroed one of this plugin's size (reading only the
// fields both know), turns each DLPack input into a borrowed at::Tensor,
// runs the v1 call, and hands its outputs over together (common.h's
// Outputs) or returns its error as a KEEL_Error. Anything libtorch throws
// becomes backend_error.
#include <algorithm>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common.h"

extern "C" std::uint64_t aoti_torch_abi_version();

namespace keel::c_api {
namespace {

#define KEEL_STR2(x) #x
#define KEEL_STR(x) KEEL_STR2(x)

// Read by the loader from the file, before the plugin is loaded.
__attribute__((section(".keel_plugin"), used)) const char kPluginNote[] =
    "release=" KEEL_PLUGIN_TORCH_RELEASE "\nflavour=" KEEL_PLUGIN_FLAVOUR
    "\napi=" KEEL_STR(KEEL_C_API_MAJOR) "." KEEL_STR(KEEL_C_API_MINOR) "\n";

std::string release_of(std::uint64_t abi) {
  return std::to_string(abi >> 56) + "." + std::to_string((abi >> 48) & 0xff) + "." +
         std::to_string((abi >> 40) & 0xff);
}

const std::string& build_info_json() {
  static const std::string text = [] {
    const BuildInfo& b = build_info();
    nlohmann::json adapters = nlohmann::json::array();
    for (const AdapterInfo& a : b.adapters) {
      nlohmann::json caps = nlohmann::json::array();
      for (const CapabilityInfo& c : a.capabilities) {
        caps.push_back({{"operation", c.operation},
                        {"dtypes", c.dtypes},
                        {"devices", c.devices},
                        {"features", c.features},
                        {"implementation", c.implementation}});
      }
      adapters.push_back(
          {{"name", a.name}, {"description", a.description}, {"capabilities", caps}});
    }
    return nlohmann::json{{"keel_version", b.keel_version},
                          {"torch_version", b.torch_version},
                          {"cuda", b.cuda},
                          {"compiler", b.compiler},
                          {"build_type", b.build_type},
                          {"cxx_standard", b.cxx_standard},
                          {"c_api", KEEL_STR(KEEL_C_API_MAJOR) "." KEEL_STR(KEEL_C_API_MINOR)},
                          {"adapters", adapters}}
        .dump();
  }();
  return text;
}

// keel's name of a floating DLPack dtype (the names capabilities list).
std::string dtype_name_of(DLDataType t) {
  if (t.lanes != 1) return "";
  if (t.code == kDLFloat) {
    return t.bits == 16 ? "float16" : t.bits == 32 ? "float32" : t.bits == 64 ? "float64" : "";
  }
  return t.code == kDLBfloat && t.bits == 16 ? "bfloat16" : "";
}

}  // namespace

// ---------------------------------------------------------------- errors

// Errors have nowhere to report a bad argument struct to: a NULL or too
// small one is ignored.
void error_destroy(KEEL_Error_Destroy_Args* args) noexcept {
  if (!check_size(args, "args")) return;
  if (args->error == nullptr || args->error == out_of_memory()) return;
  delete args->error;
}

void error_message(KEEL_Error_Message_Args* args) noexcept {
  if (!check_size(args, "args")) return;
  Outputs<KEEL_Error_Message_Args> out(args, &KEEL_Error_Message_Args::message,
                                       &KEEL_Error_Message_Args::message_size);
  const KEEL_Error* e = args->error;
  out.set(&KEEL_Error_Message_Args::message, e == nullptr ? "" : e->message.c_str());
  out.set(&KEEL_Error_Message_Args::message_size, e == nullptr ? 0 : e->message.size());
  out.commit();
}

void error_get_code(KEEL_Error_GetCode_Args* args) noexcept {
  if (!check_size(args, "args")) return;
  Outputs<KEEL_Error_GetCode_Args> out(args, &KEEL_Error_GetCode_Args::code);
  out.set(&KEEL_Error_GetCode_Args::code,
          args->error == nullptr ? KEEL_ERRC_OK : args->error->code);
  out.commit();
}

// ---------------------------------------------------------------- plugin

KEEL_Error* plugin_info(KEEL_Plugin_Info_Args* args) noexcept {
  return guarded("KEEL_Plugin_Info", [&]() -> KEEL_Error* {
    using A = KEEL_Plugin_Info_Args;
    if (result<void> ok = check_size(args, Traits<A>::name); !ok) return to_c(ok.error());
    Outputs<A> out(args, &A::keel_version, &A::torch_release, &A::torch_loaded,
                   &A::torch_abi_version, &A::flavour, &A::build_info_json);
    static const std::uint64_t abi = aoti_torch_abi_version();
    static const std::string loaded = release_of(abi);
    out.set(&A::keel_version, version());
    out.set(&A::torch_release, KEEL_PLUGIN_TORCH_RELEASE);
    out.set(&A::torch_loaded, loaded.c_str());
    out.set(&A::torch_abi_version, abi);
    out.set(&A::flavour, KEEL_PLUGIN_FLAVOUR);
    out.set(&A::build_info_json, build_info_json().c_str());
    return out.commit();
  });
}

KEEL_Error* capability_query(KEEL_Capability_Query_Args* args) noexcept {
  return guarded("KEEL_Capability_Query", [&]() -> KEEL_Error* {
    using A = KEEL_Capability_Query_Args;
    KEEL_TRY(a, sized(args));
    Outputs<A> out(args, &A::supported, &A::adapter);
    static const char* const operations[] = {"attention", "linear_cross_entropy", "logsumexp",
                                             "comm"};
    if (a.operation < 0 || a.operation > KEEL_OPERATION_COMM) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT,
                        "operation is " + std::to_string(a.operation) + ", not a KEEL_Operation");
    }
    KEEL_TRY(backend, backend_of(a.backend, "backend"));
    const char* device = a.device_type == kDLCPU ? "cpu" : a.device_type == kDLCUDA ? "cuda" : "";
    const std::string dtype = dtype_name_of(a.dtype);
    out.set(&A::supported, 0);
    out.set(&A::adapter, "");
    for (const AdapterInfo& adapter : build_info().adapters) {
      if ((backend == Backend::compat || backend == Backend::native) &&
          adapter.name != to_string(backend)) {
        continue;
      }
      for (const CapabilityInfo& c : adapter.capabilities) {
        if (c.operation != operations[a.operation]) continue;
        const bool has_dtype = std::find(c.dtypes.begin(), c.dtypes.end(), dtype) != c.dtypes.end();
        const bool has_device =
            std::find(c.devices.begin(), c.devices.end(), device) != c.devices.end();
        if (has_dtype && has_device) {
          out.set(&A::supported, 1);
          out.set(&A::adapter, adapter.name.c_str());
          return out.commit();
        }
      }
    }
    return out.commit();
  });
}

namespace {

const KEEL_Api kApi = {
    sizeof(KEEL_Api),
    nullptr,
    {KEEL_Api_Version_STRUCT_SIZE, KEEL_C_API_MAJOR, KEEL_C_API_MINOR},
    &error_destroy,
    &error_message,
    &error_get_code,
    &plugin_info,
    &capability_query,
    &attention_forward,
    &attention_backward,
    &attention_paged,
    &attention_packed_paged,
    &logsumexp_call,
    &loss_forward,
    &loss_forward_backward,
    &comm_create,
    &comm_destroy,
    &comm_info,
    &comm_all_reduce,
    &comm_broadcast,
    &comm_all_gather,
    &comm_reduce_scatter,
    &comm_all_to_all,
    &comm_send,
    &comm_recv,
    &comm_barrier,
    &work_wait,
    &work_destroy,
    &comm_split,
    &comm_reform,
    &comm_abort,
    &compat_record,
    &compat_compare,
};

}  // namespace
}  // namespace keel::c_api

extern "C" __attribute__((visibility("default"))) const KEEL_Api* keel_plugin_get_api(void) {
  return &keel::c_api::kApi;
}
