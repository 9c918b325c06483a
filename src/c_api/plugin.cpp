// A keel plugin: keel::v1 behind the C ABI's function table
// (include/keel/c/keel.h). Sees only the public headers: every call is the
// keel::v1 call of the same release, so the numbers are the same, bitwise.
//
// Every entry point is noexcept: it copies the caller's argument structs into
// zeroed ones of this plugin's size (reading only the fields both know),
// turns each DLPack input into a borrowed at::Tensor, runs the v1 call, and
// returns its outputs as caller-owned DLPack tensors or its error as a
// KEEL_Error. Anything libtorch throws becomes backend_error.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include "device.h"
#include "dlpack_bridge.h"
#include "keel/c/keel.h"
#include "keel/keel.h"

extern "C" std::uint64_t aoti_torch_abi_version();

// The opaque types of the C ABI.
struct KEEL_Error {
  std::int32_t code;
  std::string message;
};
struct KEEL_Comm {
  keel::comm::Communicator comm;
};
struct KEEL_Work {
  keel::comm::Work work;
  std::vector<at::Tensor> tensors;  // alive until the work is freed
};

namespace keel::c_api {
namespace {

#define KEEL_STR2(x) #x
#define KEEL_STR(x) KEEL_STR2(x)

// Read by the loader from the file, before the plugin is loaded.
__attribute__((section(".keel_plugin"), used)) const char kPluginNote[] =
    "release=" KEEL_PLUGIN_TORCH_RELEASE "\nflavour=" KEEL_PLUGIN_FLAVOUR
    "\napi=" KEEL_STR(KEEL_C_API_MAJOR) "." KEEL_STR(KEEL_C_API_MINOR) "\n";

// Handed out when allocating an error fails; never freed.
KEEL_Error out_of_memory{KEEL_ERRC_BACKEND_ERROR, "keel: out of memory"};

KEEL_Error* make_error(std::int32_t code, std::string message) noexcept {
  try {
    return new KEEL_Error{code, std::move(message)};
  } catch (...) {
    return &out_of_memory;
  }
}

// A new handle for the caller, or NULL when memory runs out (the calls
// that make one report it as backend_error).
template <class T, class... Args>
T* new_handle(Args&&... args) noexcept {
  try {
    return new T{std::forward<Args>(args)...};
  } catch (...) {
    return nullptr;
  }
}

KEEL_Error* to_c(const Error& e) {
  return make_error(static_cast<std::int32_t>(e.code()), e.message());
}

// Runs `body` (which returns a KEEL_Error*, NULL for success), turning any
// exception into backend_error naming the call.
template <class Body>
KEEL_Error* guarded(const char* call, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    return make_error(KEEL_ERRC_BACKEND_ERROR, std::string(call) + ": " + e.what());
  } catch (...) {
    return make_error(KEEL_ERRC_BACKEND_ERROR, std::string(call) + ": unknown exception");
  }
}

// The caller's struct, as this plugin's: the fields both know copied, the
// rest zero. `minimum` is the struct's size in its first release.
template <class T>
result<T> sized(const T* in, std::size_t minimum, const char* name) {
  T out{};
  if (in == nullptr) return Error(Errc::invalid_argument, std::string(name) + " is NULL");
  if (in->struct_size < minimum) {
    return Error(Errc::invalid_argument,
                 std::string(name) + ".struct_size is " + std::to_string(in->struct_size) +
                     ", smaller than its first release's " + std::to_string(minimum));
  }
  std::memcpy(static_cast<void*>(&out), in, std::min(in->struct_size, sizeof(T)));
  out.struct_size = sizeof(T);
  return out;
}

result<Backend> backend_of(std::int32_t b, const char* name) {
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
  return Error(Errc::invalid_argument,
               std::string(name) + " is " + std::to_string(b) + ", not a KEEL_Backend");
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

// Every borrowed input of one call, for to_dlpack's alias check.
class Inputs {
 public:
  Inputs() { all_.reserve(8); }
  result<at::Tensor> take(const DLManagedTensorVersioned* t, const std::string& name,
                          bool optional = false) {
    result<at::Tensor> r = from_dlpack(t, name, optional);
    if (r && r.value().defined()) all_.push_back(r.value());
    return r;
  }
  DLManagedTensorVersioned* give(const at::Tensor& t) const { return to_dlpack(t, all_); }
  const std::vector<at::Tensor>& all() const { return all_; }

 private:
  std::vector<at::Tensor> all_;
};

// `var` names a declaration, which parentheses would break.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define KEEL_TRY(var, expr)                   \
  auto var##_r = (expr);                      \
  if (!var##_r) return to_c(var##_r.error()); \
  auto var = std::move(var##_r).value()
// NOLINTEND(bugprone-macro-parentheses)

result<AttentionSpec> spec_of(const KEEL_AttentionSpec* c_spec, Inputs& in) {
  AttentionSpec spec;
  if (c_spec == nullptr) return spec;
  result<KEEL_AttentionSpec> s =
      sized(c_spec, KEEL_STRUCT_SIZE(KEEL_AttentionSpec, backend), "spec");
  if (!s) return s.error();
  const KEEL_AttentionSpec& c = s.value();
  if (c.num_masks > 0 && c.masks == nullptr) {
    return Error(Errc::invalid_argument, "spec.masks is NULL with num_masks > 0");
  }
  for (std::size_t i = 0; i < c.num_masks; ++i) {
    const std::string name = "spec.masks[" + std::to_string(i) + "]";
    result<KEEL_Mask> m = sized(c.masks[i], KEEL_STRUCT_SIZE(KEEL_Mask, tensor), name.c_str());
    if (!m) return m.error();
    const KEEL_Mask& cm = m.value();
    if (cm.kind < KEEL_MASK_CAUSAL || cm.kind > KEEL_MASK_TENSOR) {
      return Error(Errc::invalid_argument,
                   name + ".kind is " + std::to_string(cm.kind) + ", not a KEEL_MaskKind");
    }
    Mask mask;
    mask.kind = static_cast<MaskKind>(cm.kind);
    result<CausalAlignment> a = alignment_of(cm.alignment, name + ".alignment");
    if (!a) return a.error();
    mask.alignment = a.value();
    mask.window_left = cm.window_left;
    mask.window_right = cm.window_right;
    mask.chunk_size = cm.chunk_size;
    mask.block.q_block_size = cm.q_block_size > 0 ? cm.q_block_size : 128;
    mask.block.kv_block_size = cm.kv_block_size > 0 ? cm.kv_block_size : 128;
    const std::pair<at::Tensor*, std::pair<const DLManagedTensorVersioned*, const char*>> fields[] =
        {
            {&mask.prefix_lengths, {cm.prefix_lengths, ".prefix_lengths"}},
            {&mask.q_document_ids, {cm.q_document_ids, ".q_document_ids"}},
            {&mask.kv_document_ids, {cm.kv_document_ids, ".kv_document_ids"}},
            {&mask.kv_lengths, {cm.kv_lengths, ".kv_lengths"}},
            {&mask.block.kv_num_blocks, {cm.kv_num_blocks, ".kv_num_blocks"}},
            {&mask.block.kv_indices, {cm.kv_indices, ".kv_indices"}},
            {&mask.block.full_kv_num_blocks, {cm.full_kv_num_blocks, ".full_kv_num_blocks"}},
            {&mask.block.full_kv_indices, {cm.full_kv_indices, ".full_kv_indices"}},
            {&mask.tensor, {cm.tensor, ".tensor"}},
        };
    for (const auto& [field, source] : fields) {
      result<at::Tensor> t = in.take(source.first, name + source.second, /*optional=*/true);
      if (!t) return t.error();
      *field = t.value();
    }
    spec.masks.push_back(std::move(mask));
  }
  spec.combine = c.combine_any != 0 ? MaskCombine::any_of : MaskCombine::all_of;
  spec.scale = c.scale;
  spec.softcap = c.softcap;
  result<at::Tensor> slopes = in.take(c.alibi_slopes, "spec.alibi_slopes", true);
  if (!slopes) return slopes.error();
  spec.alibi_slopes = slopes.value();
  result<CausalAlignment> a = alignment_of(c.alibi_alignment, "spec.alibi_alignment");
  if (!a) return a.error();
  spec.alibi_alignment = a.value();
  result<at::Tensor> bias = in.take(c.bias, "spec.bias", true);
  if (!bias) return bias.error();
  spec.bias = bias.value();
  result<Backend> b = backend_of(c.backend, "spec.backend");
  if (!b) return b.error();
  spec.dispatch.backend = b.value();
  return spec;
}

// Collectives order themselves after the work queued on their tensors'
// device (c10d's own streams): they take no stream.
constexpr const char* kCommStream =
    "stream must be NULL for a collective (it is ordered after the work queued on its "
    "tensors' current stream)";

// ---------------------------------------------------------------- errors

void error_destroy(KEEL_Error_Destroy_Args* args) noexcept {
  if (args == nullptr || args->error == nullptr || args->error == &out_of_memory) return;
  delete args->error;
}

void error_message(KEEL_Error_Message_Args* args) noexcept {
  if (args == nullptr) return;
  if (args->error == nullptr) {
    args->message = "";
    args->message_size = 0;
    return;
  }
  args->message = args->error->message.c_str();
  args->message_size = args->error->message.size();
}

void error_get_code(KEEL_Error_GetCode_Args* args) noexcept {
  if (args == nullptr) return;
  args->code = args->error == nullptr ? KEEL_ERRC_OK : args->error->code;
}

// ---------------------------------------------------------------- plugin

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

KEEL_Error* plugin_info(KEEL_Plugin_Info_Args* args) noexcept {
  return guarded("KEEL_Plugin_Info", [&]() -> KEEL_Error* {
    if (args == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "args is NULL");
    if (args->struct_size < KEEL_STRUCT_SIZE(KEEL_Plugin_Info_Args, build_info_json)) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "KEEL_Plugin_Info_Args.struct_size too small");
    }
    static const std::uint64_t abi = aoti_torch_abi_version();
    static const std::string loaded = release_of(abi);
    args->keel_version = version();
    args->torch_release = KEEL_PLUGIN_TORCH_RELEASE;
    args->torch_loaded = loaded.c_str();
    args->torch_abi_version = abi;
    args->flavour = KEEL_PLUGIN_FLAVOUR;
    args->build_info_json = build_info_json().c_str();
    return nullptr;
  });
}

// keel's name of a floating DLPack dtype (the names capabilities list).
std::string dtype_name_of(DLDataType t) {
  if (t.lanes != 1) return "";
  if (t.code == kDLFloat) {
    return t.bits == 16 ? "float16" : t.bits == 32 ? "float32" : t.bits == 64 ? "float64" : "";
  }
  return t.code == kDLBfloat && t.bits == 16 ? "bfloat16" : "";
}

KEEL_Error* capability_query(KEEL_Capability_Query_Args* args) noexcept {
  return guarded("KEEL_Capability_Query", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Capability_Query_Args, adapter),
                      "KEEL_Capability_Query_Args"));
    static const char* const operations[] = {"attention", "linear_cross_entropy", "logsumexp",
                                             "comm"};
    if (a.operation < 0 || a.operation > KEEL_OPERATION_COMM) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT,
                        "operation is " + std::to_string(a.operation) + ", not a KEEL_Operation");
    }
    KEEL_TRY(backend, backend_of(a.backend, "backend"));
    const char* device = a.device_type == kDLCPU ? "cpu" : a.device_type == kDLCUDA ? "cuda" : "";
    const std::string dtype = dtype_name_of(a.dtype);
    args->supported = 0;
    args->adapter = "";
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
          args->supported = 1;
          args->adapter = adapter.name.c_str();
          return nullptr;
        }
      }
    }
    return nullptr;
  });
}

// ---------------------------------------------------------------- attention

// The paged cache of a paged call's arguments (both name its fields alike).
template <class Args>
result<PagedKVCache> cache_of(const Args& a, Inputs& in) {
  PagedKVCache cache;
  const std::pair<at::Tensor*, std::pair<const DLManagedTensorVersioned*, const char*>> fields[] = {
      {&cache.k_pages, {a.k_pages, "k_pages"}},
      {&cache.v_pages, {a.v_pages, "v_pages"}},
      {&cache.page_table, {a.page_table, "page_table"}},
      {&cache.lengths, {a.lengths, "lengths"}},
  };
  for (const auto& [field, source] : fields) {
    result<at::Tensor> t = in.take(source.first, source.second);
    if (!t) return t.error();
    *field = t.value();
  }
  return cache;
}

// An attention call's outputs, handed to the caller.
template <class Args>
KEEL_Error* give_attention(Args* args, const Inputs& in, const AttentionOutput& r) {
  args->out = in.give(r.out);
  args->lse = in.give(r.lse);
  args->served_backend = served(r.dispatch);
  return nullptr;
}

KEEL_Error* attention_forward(KEEL_Attention_Forward_Args* args) noexcept {
  return guarded("KEEL_Attention_Forward", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Attention_Forward_Args, served_backend),
                      "KEEL_Attention_Forward_Args"));
    Inputs in;
    KEEL_TRY(q, in.take(a.q, "q"));
    KEEL_TRY(stream, enter_stream(a.stream, q.device()));
    KEEL_TRY(k, in.take(a.k, "k"));
    KEEL_TRY(v, in.take(a.v, "v"));
    KEEL_TRY(spec, spec_of(a.spec, in));
    spec.return_lse = a.return_lse != 0;
    KEEL_TRY(r, attention(q, k, v, spec));
    return give_attention(args, in, r);
  });
}

KEEL_Error* attention_backward(KEEL_Attention_Backward_Args* args) noexcept {
  return guarded("KEEL_Attention_Backward", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Attention_Backward_Args, dbias),
                      "KEEL_Attention_Backward_Args"));
    Inputs in;
    KEEL_TRY(q, in.take(a.q, "q"));
    KEEL_TRY(stream, enter_stream(a.stream, q.device()));
    KEEL_TRY(k, in.take(a.k, "k"));
    KEEL_TRY(v, in.take(a.v, "v"));
    KEEL_TRY(dout, in.take(a.dout, "dout"));
    KEEL_TRY(spec, spec_of(a.spec, in));
    c10::AutoGradMode grad_mode(true);
    const at::Tensor qg = q.detach().requires_grad_(true);
    const at::Tensor kg = k.detach().requires_grad_(true);
    const at::Tensor vg = v.detach().requires_grad_(true);
    at::Tensor bias;
    if (spec.bias.defined()) {
      bias = spec.bias.detach().requires_grad_(true);
      spec.bias = bias;
    }
    KEEL_TRY(r, attention(qg, kg, vg, spec));
    if (!dout.sizes().equals(r.out.sizes())) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "dout must have out's shape [" +
                                                        c10::str(r.out.sizes()) + "], got [" +
                                                        c10::str(dout.sizes()) + "]");
    }
    r.out.backward(dout.to(r.out.scalar_type()));
    const auto grad = [](const at::Tensor& t) {
      return t.grad().defined() ? t.grad() : at::zeros_like(t);
    };
    args->dq = in.give(grad(qg));
    args->dk = in.give(grad(kg));
    args->dv = in.give(grad(vg));
    args->dbias = bias.defined() ? in.give(grad(bias)) : nullptr;
    return nullptr;
  });
}

KEEL_Error* attention_paged(KEEL_Attention_Paged_Args* args) noexcept {
  return guarded("KEEL_Attention_Paged", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Attention_Paged_Args, served_backend),
                      "KEEL_Attention_Paged_Args"));
    Inputs in;
    KEEL_TRY(q, in.take(a.q, "q"));
    KEEL_TRY(stream, enter_stream(a.stream, q.device()));
    KEEL_TRY(cache, cache_of(a, in));
    KEEL_TRY(spec, spec_of(a.spec, in));
    spec.return_lse = a.return_lse != 0;
    c10::NoGradGuard no_grad;
    KEEL_TRY(r, attention(q, cache, spec));
    return give_attention(args, in, r);
  });
}

KEEL_Error* attention_packed_paged(KEEL_Attention_PackedPaged_Args* args) noexcept {
  return guarded("KEEL_Attention_PackedPaged", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Attention_PackedPaged_Args, served_backend),
                      "KEEL_Attention_PackedPaged_Args"));
    Inputs in;
    KEEL_TRY(q, in.take(a.q, "q"));
    KEEL_TRY(stream, enter_stream(a.stream, q.device()));
    KEEL_TRY(cu, in.take(a.cu_seqlens_q, "cu_seqlens_q"));
    KEEL_TRY(cache, cache_of(a, in));
    KEEL_TRY(spec, spec_of(a.spec, in));
    spec.return_lse = a.return_lse != 0;
    c10::NoGradGuard no_grad;
    KEEL_TRY(r, attention(PackedQueries{q, cu}, cache, spec));
    return give_attention(args, in, r);
  });
}

// ---------------------------------------------------------------- logsumexp

KEEL_Error* logsumexp_call(KEEL_Logsumexp_Args* args) noexcept {
  return guarded("KEEL_Logsumexp", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Logsumexp_Args, served_backend),
                      "KEEL_Logsumexp_Args"));
    Inputs in;
    KEEL_TRY(input, in.take(a.input, "input"));
    KEEL_TRY(mask, in.take(a.mask, "mask", true));
    KEEL_TRY(backend, backend_of(a.backend, "backend"));
    LogsumexpOptions o;
    o.dim = a.dim;
    o.keepdim = a.keepdim != 0;
    o.mask = mask;
    o.dispatch.backend = backend;
    KEEL_TRY(r, logsumexp(input, o));
    args->value = in.give(r.value);
    args->served_backend = served(r.dispatch);
    return nullptr;
  });
}

// ---------------------------------------------------------------- loss

result<LinearCrossEntropyOptions> loss_options_of(const KEEL_LinearCrossEntropy_Options* c_options,
                                                  Inputs& in) {
  LinearCrossEntropyOptions o;
  if (c_options == nullptr) return o;
  result<KEEL_LinearCrossEntropy_Options> s =
      sized(c_options, KEEL_STRUCT_SIZE(KEEL_LinearCrossEntropy_Options, backend), "options");
  if (!s) return s.error();
  const KEEL_LinearCrossEntropy_Options& c = s.value();
  if (c.reduction < KEEL_REDUCTION_MEAN || c.reduction > KEEL_REDUCTION_NONE) {
    return Error(Errc::invalid_argument,
                 "options.reduction is " + std::to_string(c.reduction) + ", not a KEEL_Reduction");
  }
  o.reduction = static_cast<Reduction>(c.reduction);
  o.ignore_index = c.ignore_index;
  o.label_smoothing = c.label_smoothing;
  result<at::Tensor> weights = in.take(c.class_weights, "options.class_weights", true);
  if (!weights) return weights.error();
  o.class_weights = weights.value();
  o.z_loss = c.z_loss;
  o.logit_softcap = c.logit_softcap;
  result<at::Tensor> bias = in.take(c.bias, "options.bias", true);
  if (!bias) return bias.error();
  o.bias = bias.value();
  o.chunk_size = c.chunk_size;
  o.vocab_chunk_size = c.vocab_chunk_size;
  o.chunk_budget_bytes = c.chunk_budget_bytes;
  o.return_per_token_loss = c.return_per_token_loss != 0;
  o.return_lse = c.return_lse != 0;
  result<Backend> b = backend_of(c.backend, "options.backend");
  if (!b) return b.error();
  o.dispatch.backend = b.value();
  if (c.communicator != nullptr) {
    o.vocab_parallel.communicator = c.communicator->comm;
    o.vocab_parallel.vocab_start = c.vocab_start;
  }
  return o;
}

KEEL_Error* loss_forward(KEEL_LinearCrossEntropy_Forward_Args* args) noexcept {
  return guarded("KEEL_LinearCrossEntropy_Forward", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_LinearCrossEntropy_Forward_Args, served_backend),
                      "KEEL_LinearCrossEntropy_Forward_Args"));
    Inputs in;
    KEEL_TRY(hidden, in.take(a.hidden, "hidden"));
    KEEL_TRY(weight, in.take(a.weight, "weight"));
    KEEL_TRY(target, in.take(a.target, "target"));
    KEEL_TRY(o, loss_options_of(a.options, in));
    c10::NoGradGuard no_grad;
    KEEL_TRY(r, linear_cross_entropy(hidden, weight, target, o));
    args->loss = in.give(r.loss);
    args->per_token_loss = in.give(r.per_token_loss);
    args->lse = in.give(r.lse);
    args->served_backend = served(r.dispatch);
    return nullptr;
  });
}

KEEL_Error* loss_forward_backward(KEEL_LinearCrossEntropy_ForwardBackward_Args* args) noexcept {
  return guarded("KEEL_LinearCrossEntropy_ForwardBackward", [&]() -> KEEL_Error* {
    KEEL_TRY(
        a,
        sized(args, KEEL_STRUCT_SIZE(KEEL_LinearCrossEntropy_ForwardBackward_Args, served_backend),
              "KEEL_LinearCrossEntropy_ForwardBackward_Args"));
    Inputs in;
    KEEL_TRY(hidden, in.take(a.hidden, "hidden"));
    KEEL_TRY(weight, in.take(a.weight, "weight"));
    KEEL_TRY(target, in.take(a.target, "target"));
    KEEL_TRY(dloss, in.take(a.dloss, "dloss", true));
    KEEL_TRY(o, loss_options_of(a.options, in));
    c10::AutoGradMode grad_mode(true);
    const at::Tensor hg = hidden.detach().requires_grad_(true);
    const at::Tensor wg = weight.detach().requires_grad_(true);
    at::Tensor bias;
    if (o.bias.defined()) {
      bias = o.bias.detach().requires_grad_(true);
      o.bias = bias;
    }
    KEEL_TRY(r, linear_cross_entropy(hg, wg, target, o));
    if (dloss.defined() && !dloss.sizes().equals(r.loss.sizes())) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "dloss must have loss's shape [" +
                                                        c10::str(r.loss.sizes()) + "], got [" +
                                                        c10::str(dloss.sizes()) + "]");
    }
    r.loss.backward(dloss.defined() ? dloss.to(r.loss.scalar_type()) : at::ones_like(r.loss));
    const auto grad = [](const at::Tensor& t) {
      return t.grad().defined() ? t.grad() : at::zeros_like(t);
    };
    args->loss = in.give(r.loss);
    args->per_token_loss = in.give(r.per_token_loss);
    args->lse = in.give(r.lse);
    args->dhidden = in.give(grad(hg));
    args->dweight = in.give(grad(wg));
    args->dbias = bias.defined() ? in.give(grad(bias)) : nullptr;
    args->served_backend = served(r.dispatch);
    return nullptr;
  });
}

// ---------------------------------------------------------------- comm

std::chrono::milliseconds ms_or(std::int64_t ms, std::chrono::milliseconds otherwise) {
  return ms > 0 ? std::chrono::milliseconds(ms) : otherwise;
}

KEEL_Error* comm_create(KEEL_Comm_Create_Args* args) noexcept {
  return guarded("KEEL_Comm_Create", [&]() -> KEEL_Error* {
    KEEL_TRY(a,
             sized(args, KEEL_STRUCT_SIZE(KEEL_Comm_Create_Args, comm), "KEEL_Comm_Create_Args"));
    comm::CommOptions o;
    if (a.backend < KEEL_COMM_AUTOMATIC || a.backend > KEEL_COMM_NCCL) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT,
                        "backend is " + std::to_string(a.backend) + ", not a KEEL_CommBackend");
    }
    o.backend = static_cast<comm::CommBackend>(a.backend);
    if (a.rendezvous != nullptr) o.rendezvous = a.rendezvous;
    if (a.rank >= 0) o.rank = a.rank;
    if (a.world_size >= 0) o.world_size = a.world_size;
    o.timeout = ms_or(a.timeout_ms, o.timeout);
    if (a.name != nullptr) o.name = a.name;
    o.checked = a.checked != 0;
    o.heartbeat_interval = ms_or(a.heartbeat_interval_ms, o.heartbeat_interval);
    o.peer_timeout = ms_or(a.peer_timeout_ms, o.peer_timeout);
    if (a.generation >= 0) o.generation = a.generation;
    o.rejoin = a.rejoin != 0;
    KEEL_TRY(backend, backend_of(a.dispatch_backend, "dispatch_backend"));
    o.dispatch.backend = backend;
    KEEL_TRY(c, comm::Communicator::create(o));
    args->comm = new_handle<KEEL_Comm>(std::move(c));
    if (args->comm == nullptr) return &out_of_memory;
    return nullptr;
  });
}

void comm_destroy(KEEL_Comm_Destroy_Args* args) noexcept {
  if (args != nullptr) delete args->comm;
}

KEEL_Error* comm_info(KEEL_Comm_Info_Args* args) noexcept {
  return guarded("KEEL_Comm_Info", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Comm_Info_Args, name), "KEEL_Comm_Info_Args"));
    if (a.comm == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "comm is NULL");
    const comm::Communicator& c = a.comm->comm;
    args->rank = c.rank();
    args->size = c.size();
    args->local_rank = c.local_rank();
    args->generation = c.generation();
    args->aborted = c.is_aborted() ? 1 : 0;
    args->name = c.name().c_str();
    return nullptr;
  });
}

// A tensor the collective writes: the caller's memory, never read-only.
result<at::Tensor> writable(const DLManagedTensorVersioned* t, const char* name, Inputs& in) {
  if (t != nullptr && (t->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0) {
    return Error(Errc::invalid_argument,
                 std::string(name) + " is read-only, and this collective writes it");
  }
  return in.take(t, name);
}

// A synchronous call's result as a finished Work.
result<comm::Work> done(result<void> r) {
  if (!r) return r.error();
  return comm::Work();
}

result<std::vector<std::int64_t>> splits_of(const std::int64_t* p, std::size_t n,
                                            const char* name) {
  if (n > 0 && p == nullptr) {
    return Error(Errc::invalid_argument, std::string(name) + " is NULL with a count");
  }
  return std::vector<std::int64_t>(p, p + n);
}

result<comm::Work> run_collective(const KEEL_Comm_Collective_Args& a, Inputs& in) {
  if (a.op < KEEL_REDUCE_SUM || a.op > KEEL_REDUCE_PRODUCT) {
    return Error(Errc::invalid_argument, "op is " + std::to_string(a.op) + ", not a KEEL_ReduceOp");
  }
  const auto op = static_cast<comm::ReduceOp>(a.op);
  comm::CallOptions call;
  if (a.timeout_ms > 0) call.timeout = std::chrono::milliseconds(a.timeout_ms);
  comm::Communicator& c = a.comm->comm;
  const bool async = a.async != 0;
  switch (a.collective) {
    case KEEL_COLLECTIVE_ALL_REDUCE: {
      result<at::Tensor> t = writable(a.tensor, "tensor", in);
      if (!t) return t.error();
      return async ? c.all_reduce_async(t.value(), op, call)
                   : done(c.all_reduce(t.value(), op, call));
    }
    case KEEL_COLLECTIVE_BROADCAST: {
      result<at::Tensor> t = writable(a.tensor, "tensor", in);
      if (!t) return t.error();
      return async ? c.broadcast_async(t.value(), a.peer, call)
                   : done(c.broadcast(t.value(), a.peer, call));
    }
    case KEEL_COLLECTIVE_RECV: {
      result<at::Tensor> t = writable(a.tensor, "tensor", in);
      if (!t) return t.error();
      return async ? c.recv_async(t.value(), a.peer, a.tag, call)
                   : done(c.recv(t.value(), a.peer, a.tag, call));
    }
    case KEEL_COLLECTIVE_SEND: {
      result<at::Tensor> t = in.take(a.tensor, "tensor");
      if (!t) return t.error();
      return async ? c.send_async(t.value(), a.peer, a.tag, call)
                   : done(c.send(t.value(), a.peer, a.tag, call));
    }
    case KEEL_COLLECTIVE_ALL_GATHER:
    case KEEL_COLLECTIVE_REDUCE_SCATTER:
    case KEEL_COLLECTIVE_ALL_TO_ALL: {
      result<at::Tensor> out = writable(a.output, "output", in);
      if (!out) return out.error();
      result<at::Tensor> input = in.take(a.input, "input");
      if (!input) return input.error();
      at::Tensor& o = out.value();
      const at::Tensor& i = input.value();
      if (a.collective == KEEL_COLLECTIVE_ALL_GATHER) {
        return async ? c.all_gather_async(o, i, call) : done(c.all_gather(o, i, call));
      }
      if (a.collective == KEEL_COLLECTIVE_REDUCE_SCATTER) {
        return async ? c.reduce_scatter_async(o, i, op, call)
                     : done(c.reduce_scatter(o, i, op, call));
      }
      result<std::vector<std::int64_t>> os =
          splits_of(a.output_splits, a.num_output_splits, "output_splits");
      if (!os) return os.error();
      result<std::vector<std::int64_t>> is =
          splits_of(a.input_splits, a.num_input_splits, "input_splits");
      if (!is) return is.error();
      return async ? c.all_to_all_async(o, i, os.value(), is.value(), call)
                   : done(c.all_to_all(o, i, os.value(), is.value(), call));
    }
    case KEEL_COLLECTIVE_BARRIER:
      if (async) return Error(Errc::invalid_argument, "a barrier is not asynchronous");
      return done(c.barrier(call));
    default:
      break;
  }
  return Error(Errc::invalid_argument,
               "collective is " + std::to_string(a.collective) + ", not a KEEL_Collective");
}

KEEL_Error* comm_collective(KEEL_Comm_Collective_Args* args) noexcept {
  return guarded("KEEL_Comm_Collective", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Comm_Collective_Args, work),
                      "KEEL_Comm_Collective_Args"));
    if (a.comm == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "comm is NULL");
    if (a.stream != nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, kCommStream);
    Inputs in;
    KEEL_TRY(work, run_collective(a, in));
    args->work = nullptr;
    if (a.async != 0) {
      args->work = new_handle<KEEL_Work>(std::move(work), in.all());
      if (args->work == nullptr) return &out_of_memory;
    }
    return nullptr;
  });
}

KEEL_Error* work_wait(KEEL_Work_Wait_Args* args) noexcept {
  return guarded("KEEL_Work_Wait", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Work_Wait_Args, poll), "KEEL_Work_Wait_Args"));
    if (a.work == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "work is NULL");
    if (a.poll == 0) {
      std::optional<std::chrono::milliseconds> timeout;
      if (a.timeout_ms > 0) timeout = std::chrono::milliseconds(a.timeout_ms);
      result<void> r = a.work->work.wait(timeout);
      if (!r) return to_c(r.error());
    }
    args->completed = a.work->work.is_completed() ? 1 : 0;
    return nullptr;
  });
}

void work_destroy(KEEL_Work_Destroy_Args* args) noexcept {
  if (args != nullptr) delete args->work;
}

KEEL_Error* comm_split(KEEL_Comm_Split_Args* args) noexcept {
  return guarded("KEEL_Comm_Split", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Comm_Split_Args, split), "KEEL_Comm_Split_Args"));
    if (a.comm == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "comm is NULL");
    if (a.num_ranks > 0 && a.ranks == nullptr) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "ranks is NULL with num_ranks > 0");
    }
    const std::vector<int> ranks(a.ranks, a.ranks + a.num_ranks);
    KEEL_TRY(sub, a.comm->comm.split(ranks, a.name != nullptr ? a.name : ""));
    args->split = new_handle<KEEL_Comm>(std::move(sub));
    if (args->split == nullptr) return &out_of_memory;
    return nullptr;
  });
}

KEEL_Error* comm_reform(KEEL_Comm_Reform_Args* args) noexcept {
  return guarded("KEEL_Comm_Reform", [&]() -> KEEL_Error* {
    KEEL_TRY(
        a, sized(args, KEEL_STRUCT_SIZE(KEEL_Comm_Reform_Args, reformed), "KEEL_Comm_Reform_Args"));
    if (a.comm == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, "comm is NULL");
    comm::ReformOptions o;
    if (a.timeout_ms > 0) o.timeout = std::chrono::milliseconds(a.timeout_ms);
    o.wait_for_replacements = a.wait_for_replacements != 0;
    KEEL_TRY(world, a.comm->comm.reform(o));
    args->reformed = new_handle<KEEL_Comm>(std::move(world));
    if (args->reformed == nullptr) return &out_of_memory;
    return nullptr;
  });
}

void comm_abort(KEEL_Comm_Abort_Args* args) noexcept {
  if (args != nullptr && args->comm != nullptr) args->comm->comm.abort();
}

// ---------------------------------------------------------------- compat

// The service's C function as a keel::compat::Function.
compat::Function compat_function(KEEL_Compat_Function* fn, void* user_data) {
  return [fn, user_data](const compat::Case& c) -> result<compat::Tensors> {
    std::vector<DLManagedTensorVersioned*> owned;
    std::vector<KEEL_NamedTensor> inputs;
    for (const auto& [name, t] : c.inputs) {
      owned.push_back(to_dlpack(t, {}));
      inputs.push_back({name.c_str(), owned.back()});
    }
    constexpr std::size_t kCapacity = 64;
    KEEL_NamedTensor outputs[kCapacity] = {};
    std::size_t count = 0;
    char error[1024] = {0};
    const std::int32_t code = fn(user_data, c.id.c_str(), inputs.data(), inputs.size(), outputs,
                                 kCapacity, &count, error, sizeof error);
    for (DLManagedTensorVersioned* m : owned) m->deleter(m);
    count = std::min(count, kCapacity);
    compat::Tensors out;
    result<void> bad = success();
    for (std::size_t i = 0; i < count; ++i) {
      const std::string name = outputs[i].name != nullptr ? outputs[i].name : "";
      result<at::Tensor> t = from_dlpack(outputs[i].tensor, "output '" + name + "'");
      if (t && bad) out[name] = t.value().clone();
      if (!t && bad) bad = t.error();
      if (outputs[i].tensor != nullptr && outputs[i].tensor->deleter != nullptr) {
        outputs[i].tensor->deleter(outputs[i].tensor);
      }
    }
    if (code != KEEL_ERRC_OK) {
      error[sizeof error - 1] = '\0';
      const auto errc = code >= KEEL_ERRC_INVALID_ARGUMENT && code <= KEEL_ERRC_CORRUPT_DATA
                            ? static_cast<Errc>(code)
                            : Errc::backend_error;
      return Error(errc, error);
    }
    if (!bad) return bad.error();
    return out;
  };
}

KEEL_Error* compat_record(KEEL_Compat_Record_Args* args) noexcept {
  return guarded("KEEL_Compat_Record", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Compat_Record_Args, user_data),
                      "KEEL_Compat_Record_Args"));
    if (a.path == nullptr || a.function == nullptr) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "path and function must not be NULL");
    }
    if (a.num_cases > 0 && a.cases == nullptr) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "cases is NULL with num_cases > 0");
    }
    std::vector<compat::Case> cases;
    for (std::size_t i = 0; i < a.num_cases; ++i) {
      const std::string name = "cases[" + std::to_string(i) + "]";
      KEEL_TRY(c, sized(a.cases[i], KEEL_STRUCT_SIZE(KEEL_Compat_Case, rtol), name.c_str()));
      if (c.id == nullptr) return make_error(KEEL_ERRC_INVALID_ARGUMENT, name + ".id is NULL");
      if (c.num_inputs > 0 && c.inputs == nullptr) {
        return make_error(KEEL_ERRC_INVALID_ARGUMENT, name + ".inputs is NULL");
      }
      compat::Case k;
      k.id = c.id;
      for (std::size_t j = 0; j < c.num_inputs; ++j) {
        const std::string input = name + ".inputs[" + std::to_string(j) + "]";
        if (c.inputs[j].name == nullptr) {
          return make_error(KEEL_ERRC_INVALID_ARGUMENT, input + ".name is NULL");
        }
        KEEL_TRY(t, from_dlpack(c.inputs[j].tensor, input));
        k.inputs[c.inputs[j].name] = t;
      }
      if (c.has_tolerance != 0) k.tolerance = compat::Tolerance{c.atol, c.rtol};
      cases.push_back(std::move(k));
    }
    result<void> recorded = compat::record(a.path, cases, compat_function(a.function, a.user_data));
    return recorded ? nullptr : to_c(recorded.error());
  });
}

KEEL_Error* compat_compare(KEEL_Compat_Compare_Args* args) noexcept {
  return guarded("KEEL_Compat_Compare", [&]() -> KEEL_Error* {
    KEEL_TRY(a, sized(args, KEEL_STRUCT_SIZE(KEEL_Compat_Compare_Args, errors),
                      "KEEL_Compat_Compare_Args"));
    if (a.path == nullptr || a.function == nullptr) {
      return make_error(KEEL_ERRC_INVALID_ARGUMENT, "path and function must not be NULL");
    }
    compat::CompareOptions o;
    if (a.repeat > 0) o.repeat = a.repeat;
    if (a.filter != nullptr) o.filter = a.filter;
    KEEL_TRY(report, compat::compare(a.path, compat_function(a.function, a.user_data), o));
    const auto write = [](const char* path, const std::string& text) {
      if (path == nullptr) return true;
      std::ofstream f(path, std::ios::binary);
      f << text;
      return static_cast<bool>(f);
    };
    if (!write(a.json_path, compat::to_json(report)) ||
        !write(a.html_path, compat::to_html(report))) {
      return make_error(KEEL_ERRC_IO_ERROR, "cannot write the report");
    }
    args->passed = report.passed;
    args->failed = report.failed;
    args->skipped = report.skipped;
    args->errors = report.errors;
    return nullptr;
  });
}

const KEEL_Api kApi = {
    sizeof(KEEL_Api),
    nullptr,
    {KEEL_STRUCT_SIZE(KEEL_Api_Version, minor), KEEL_C_API_MAJOR, KEEL_C_API_MINOR},
    &error_destroy,
    &error_message,
    &error_get_code,
    &plugin_info,
    &capability_query,
    &attention_forward,
    &attention_backward,
    &attention_paged,
    &logsumexp_call,
    &loss_forward,
    &loss_forward_backward,
    &comm_create,
    &comm_destroy,
    &comm_info,
    &comm_collective,
    &work_wait,
    &work_destroy,
    &comm_split,
    &comm_reform,
    &comm_abort,
    &compat_record,
    &compat_compare,
    &attention_packed_paged,
};

}  // namespace
}  // namespace keel::c_api

extern "C" __attribute__((visibility("default"))) const KEEL_Api* keel_plugin_get_api(void) {
  return &keel::c_api::kApi;
}
