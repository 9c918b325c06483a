/// @file keel/c/keel.h
/// @brief keel's C ABI 1.0: one service binary for every supported libtorch
/// release.
///
/// A service compiled against this header (and DLPack's `dlpack.h`, its only
/// dependency) runs unchanged on every release that has a keel plugin: the
/// loader (`keel/c/loader.h`) opens the plugin built for the libtorch the
/// process uses, and every call goes through the function table it returns.
/// No C++ type and no exception crosses; the header compiles as C11 and as
/// C++17/20. `docs/c-api.md` is the manual; what follows is the contract.
///
/// What 1.0 promises, after PJRT's C API (openxla `pjrt_c_api.h`):
/// - **One entry point.** A plugin exports `keel_plugin_get_api()`
///   (`KEEL_PLUGIN_ENTRY_POINT`), which returns a `KEEL_Api`: a table of
///   function pointers that only grows (new functions are appended).
/// - **Versions.** A service built against 1.0 runs on every later plugin
///   of major 1. `KEEL_C_API_MINOR` grows when a function or field is
///   appended; `KEEL_C_API_MAJOR` would change only if one were removed,
///   retyped or moved, and a loader refuses a plugin of another major. A
///   caller that needs a function of minor N checks `api_version.minor >= N`
///   (or the table's `struct_size`) first. The first three fields of
///   `KEEL_Api` (the bootstrap) never change, in any major.
/// - **Sizes.** Every argument struct starts with `size_t struct_size`: set
///   it to `<struct>_STRUCT_SIZE` (this header's size). A plugin reads only
///   the fields both it and the caller know: an older caller's struct leaves
///   fields appended since at their defaults, a newer caller's extra fields
///   are ignored, and a struct smaller than `<struct>_MIN_SIZE` (its first
///   release's) is `KEEL_ERRC_INVALID_ARGUMENT`. Both sizes are defined once,
///   beside each struct (`KEEL_DEFINE_STRUCT_TRAITS`). A struct with no
///   `struct_size` (`KEEL_NamedTensor`, `KEEL_Api_Version`) is frozen: its
///   size and fields never change.
/// - **Defaults.** A zeroed struct with its `struct_size` set is the
///   defaults, always: every field is defined so that 0 is its default, and
///   a value whose 0 is meaningful comes with a `has_` flag
///   (`has_ignore_index`).
/// - **Outputs.** Fields marked "Out" are written by the plugin, and only
///   those the caller's `struct_size` covers: a plugin never writes past the
///   caller's struct. On success each tensor or handle output is the
///   caller's. On error every output field is zero (NULL), and nothing was
///   handed over: a call either gives all its outputs or none.
/// - **Errors.** A call returns NULL on success or a `KEEL_Error*` that the
///   caller owns and frees with `KEEL_Error_Destroy`; it carries keel's
///   `Errc` (`KEEL_Errc`, the same values as `keel::Errc`) and a message
///   naming the argument. Bad input, including a NULL pointer, a tensor of
///   the wrong dtype or a struct too small, is an error value, never a
///   crash. Destroy and abort calls take sized arguments too, and return an
///   error for a struct too small (`KEEL_Error_Destroy` then frees nothing).
/// - **Threads.** Every function may be called from any thread, and
///   concurrently: the compute calls (attention, logsumexp, the loss) share
///   no state between calls. A communicator's collectives follow
///   `keel::comm`'s rule: every rank issues them in the same order; calls
///   on one communicator from several threads must be ordered by the
///   caller. A handle must not be destroyed while a call uses it.
/// - **Extensions.** Optional features hang off `extension_start` as a chain
///   of `KEEL_Extension_Base`, each typed and sized; a plugin ignores a type
///   it does not know. None is defined in 1.0.
///
/// Tensors cross as DLPack 1.x `DLManagedTensorVersioned`:
/// - **Inputs are borrowed**, and `const`. The plugin reads them in place
///   (no copy but the one "Any layout" names) for the duration of the call
///   and never calls their deleter; the caller keeps them alive until the
///   call returns. keel never writes an input, so an input flagged
///   `DLPACK_FLAG_BITMASK_READ_ONLY` is fine anywhere. An input of another
///   DLPack major version is `KEEL_ERRC_INVALID_ARGUMENT`. The tensors a
///   collective writes in place are the only non-`const` tensor arguments.
/// - **Any layout.** An input may have any non-negative `strides` (NULL for
///   compact row-major), a `byte_offset`, stride 0 for a broadcast
///   dimension, or a zero-size dimension: the plugin reads it as keel::v1
///   does (`keel/v1/attention.h`, "Layouts": an attention input whose last
///   dimension is strided is copied for the call, every other layout is read
///   in place). A negative stride is `KEEL_ERRC_INVALID_ARGUMENT`.
/// - **Outputs are owned by the caller.** Each output is a new
///   `DLManagedTensorVersioned*` allocated by the plugin (its memory is
///   libtorch's, never an alias of an input); free it with
///   `t->deleter(t)`, from any thread, before the plugin's process exits.
///   Outputs are writable and contiguous.
/// - **Devices and streams.** A plugin's flavour says what it serves: a
///   "cpu" plugin takes CPU tensors, and a CUDA tensor is
///   `KEEL_ERRC_UNSUPPORTED`; a CUDA plugin ("cu132": the CUDA release its
///   libtorch was built for) takes CPU and CUDA tensors. `stream` is the
///   CUDA stream (`cudaStream_t`) that a CUDA call is ordered on: the call
///   makes it current on the tensors' device, so its work follows what the
///   caller queued there, and its outputs are ready in that stream's order
///   when it returns; NULL is libtorch's current stream. It must be NULL for
///   CPU tensors (`KEEL_ERRC_INVALID_ARGUMENT`). Collectives take no stream:
///   c10d orders them after the work queued on their tensors' current
///   stream.
///
/// What crosses in 1.0: build information and typed capabilities; attention
/// forward with every mask and modifier, its explicit backward (no autograd
/// graph crosses a C boundary, as in FlashAttention's API) and the paged-cache
/// call, also over packed ragged queries; logsumexp; linear cross-entropy
/// forward and forward+backward, also vocabulary-parallel; the communicator
/// (created by environment, URL or options; each collective its own call,
/// sync or async with bounded waits; abort, reform, rejoin, split); and
/// `keel::compat` record/compare over C callbacks. Left out, with the reason:
/// the flight recorder's dump and `dedicated()` (diagnostics and a tuning
/// aid, reachable through keel::v1; they add no capability a service needs
/// to run), and `DispatchInfo`'s reason text (the served backend crosses as
/// a value).
// A C header: clang-tidy's C++ checks (using over typedef, <cstdint>) do
// not apply to it.
// NOLINTBEGIN
#ifndef KEEL_C_KEEL_H_
#define KEEL_C_KEEL_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/// The C ABI's major version: a plugin and a loader of different majors
/// refuse each other.
#define KEEL_C_API_MAJOR 1
/// The C ABI's minor version: appended functions and fields.
#define KEEL_C_API_MINOR 0

/// The symbol every plugin exports (`const KEEL_Api* keel_plugin_get_api(void)`).
#define KEEL_PLUGIN_ENTRY_POINT "keel_plugin_get_api"

/// The size of `type` up to and including `last_field`.
#define KEEL_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

/// Defines, once beside a struct, `<type>_MIN_SIZE` (through `first_last_field`,
/// the last field of the struct's first release: a plugin refuses a smaller
/// `struct_size`) and `<type>_STRUCT_SIZE` (through `last_field`, this
/// header's: what a caller sets). A later minor that appends a field moves
/// `last_field` only.
#define KEEL_DEFINE_STRUCT_TRAITS(type, first_last_field, last_field) \
  enum {                                                              \
    type##_MIN_SIZE = (int)KEEL_STRUCT_SIZE(type, first_last_field),  \
    type##_STRUCT_SIZE = (int)KEEL_STRUCT_SIZE(type, last_field)      \
  }

/// keel's error codes, the values of `keel::Errc`.
typedef enum KEEL_Errc {
  KEEL_ERRC_OK = 0,                ///< Not an error (never carried by a `KEEL_Error`).
  KEEL_ERRC_INVALID_ARGUMENT = 1,  ///< The arguments are wrong: shape, dtype, range, NULL.
  KEEL_ERRC_UNSUPPORTED = 2,       ///< Valid, but this plugin cannot serve it.
  KEEL_ERRC_TIMEOUT = 3,           ///< A bounded wait ran out.
  KEEL_ERRC_PEER_LOST = 4,         ///< A peer of a collective died or left.
  KEEL_ERRC_ABORTED = 5,           ///< The communicator or operation was aborted.
  KEEL_ERRC_BACKEND_ERROR = 6,     ///< libtorch failed while serving a valid call.
  KEEL_ERRC_IO_ERROR = 7,          ///< Reading or writing a file or socket failed.
  KEEL_ERRC_CORRUPT_DATA = 8,      ///< A file (or a plugin) is truncated or not what it claims.
} KEEL_Errc;

/// Which adapter serves a call (`keel::Backend`).
typedef enum KEEL_Backend {
  KEEL_BACKEND_UNSET = 0,      ///< The process default (`KEEL_BACKEND`, else automatic).
  KEEL_BACKEND_AUTOMATIC = 1,  ///< The best adapter that serves the call.
  KEEL_BACKEND_COMPAT = 2,     ///< keel's own kernels, on every release.
  KEEL_BACKEND_NATIVE = 3,     ///< What the release offers natively, else unsupported.
} KEEL_Backend;

/// An error: opaque, owned by the caller, freed with `KEEL_Error_Destroy`.
typedef struct KEEL_Error KEEL_Error;
/// A communicator (`keel::comm::Communicator`): opaque, freed with
/// `KEEL_Comm_Destroy`.
typedef struct KEEL_Comm KEEL_Comm;
/// An asynchronous collective in flight: opaque, freed with `KEEL_Work_Destroy`.
typedef struct KEEL_Work KEEL_Work;

/// The head of every extension in a chain.
typedef struct KEEL_Extension_Base {
  size_t struct_size;                ///< The extension's size.
  uint32_t type;                     ///< Which extension (none defined in 1.0).
  struct KEEL_Extension_Base* next;  ///< The next in the chain, or NULL.
} KEEL_Extension_Base;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Extension_Base, next, next);

/// A version of the C ABI. Embedded in `KEEL_Api`: frozen, never grows.
typedef struct KEEL_Api_Version {
  size_t struct_size;  ///< `KEEL_Api_Version_STRUCT_SIZE`.
  uint32_t major;      ///< `KEEL_C_API_MAJOR` the plugin was built with.
  uint32_t minor;      ///< `KEEL_C_API_MINOR` the plugin was built with.
} KEEL_Api_Version;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Api_Version, minor, minor);

// ---------------------------------------------------------------- errors

/// Arguments of `KEEL_Error_Destroy`.
typedef struct KEEL_Error_Destroy_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Error* error;                     ///< The error to free; NULL is a no-op.
} KEEL_Error_Destroy_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Error_Destroy_Args, error, error);
/// Frees an error (nothing, when `args` is NULL or too small: an error has
/// nowhere to go).
typedef void KEEL_Error_Destroy_Fn(KEEL_Error_Destroy_Args* args);

/// Arguments of `KEEL_Error_Message`.
typedef struct KEEL_Error_Message_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const KEEL_Error* error;               ///< The error.
  const char* message;                   ///< Out: NUL-terminated, alive as long as `error`.
  size_t message_size;                   ///< Out: its length without the NUL.
} KEEL_Error_Message_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Error_Message_Args, message_size, message_size);
/// The error's message, which names the call and the argument ("" for a
/// NULL error; nothing is written when `args` is NULL or too small).
typedef void KEEL_Error_Message_Fn(KEEL_Error_Message_Args* args);

/// Arguments of `KEEL_Error_GetCode`.
typedef struct KEEL_Error_GetCode_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const KEEL_Error* error;               ///< The error.
  int32_t code;                          ///< Out: a `KEEL_Errc`.
} KEEL_Error_GetCode_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Error_GetCode_Args, code, code);
/// The error's code (`KEEL_ERRC_OK` for a NULL error; nothing is written
/// when `args` is NULL or too small).
typedef void KEEL_Error_GetCode_Fn(KEEL_Error_GetCode_Args* args);

// ---------------------------------------------------------------- plugin

/// Arguments of `KEEL_Plugin_Info`. Every string is the plugin's, alive
/// until the process exits.
typedef struct KEEL_Plugin_Info_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const char* keel_version;              ///< Out: keel's version, "0.6.0".
  const char* torch_release;             ///< Out: the libtorch release it was built on, "2.15.0".
  const char* torch_loaded;              ///< Out: the release of the libtorch loaded now
                                         ///< (from `aoti_torch_abi_version()`).
  uint64_t torch_abi_version;   ///< Out: `aoti_torch_abi_version()` of the loaded libtorch.
  const char* flavour;          ///< Out: "cpu", or the CUDA flavour ("cu132").
  const char* build_info_json;  ///< Out: `keel-info --json` of the plugin.
} KEEL_Plugin_Info_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Plugin_Info_Args, build_info_json, build_info_json);
/// What the plugin is and which libtorch it runs on.
typedef KEEL_Error* KEEL_Plugin_Info_Fn(KEEL_Plugin_Info_Args* args);

/// The operations a capability query names.
typedef enum KEEL_Operation {
  KEEL_OPERATION_ATTENTION = 0,             ///< `KEEL_Attention_*`.
  KEEL_OPERATION_LINEAR_CROSS_ENTROPY = 1,  ///< `KEEL_LinearCrossEntropy_*`.
  KEEL_OPERATION_LOGSUMEXP = 2,             ///< `KEEL_Logsumexp`.
  KEEL_OPERATION_COMM = 3,                  ///< The communicator (served by keel::v1).
} KEEL_Operation;

/// Arguments of `KEEL_Capability_Query`.
typedef struct KEEL_Capability_Query_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  int32_t operation;                     ///< A `KEEL_Operation`.
  int32_t backend;                       ///< A `KEEL_Backend`; unset and automatic mean any.
  DLDataType dtype;                      ///< The dtype asked about (lanes 1).
  int32_t device_type;                   ///< A `DLDeviceType` (kDLCPU, kDLCUDA).
  int32_t supported;                     ///< Out: 1 when some adapter serves it, else 0.
  const char* adapter;  ///< Out: the adapter that does ("compat", "native"), or "".
} KEEL_Capability_Query_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Capability_Query_Args, adapter, adapter);
/// Whether this plugin serves `operation` for `dtype` on `device_type`: the
/// same capability values that `keel-info` prints and dispatch obeys.
typedef KEEL_Error* KEEL_Capability_Query_Fn(KEEL_Capability_Query_Args* args);

// ---------------------------------------------------------------- attention

/// The kind of one mask term (`keel::MaskKind`).
typedef enum KEEL_MaskKind {
  KEEL_MASK_CAUSAL = 0,          ///< Key j visible from query position p when j <= p.
  KEEL_MASK_SLIDING_WINDOW = 1,  ///< p - window_left <= j <= p + window_right.
  KEEL_MASK_CHUNKED_CAUSAL = 2,  ///< j <= p within chunks of `chunk_size` positions.
  KEEL_MASK_PREFIX_LM = 3,       ///< j < prefix_lengths[b] or j <= p.
  KEEL_MASK_DOCUMENT = 4,        ///< q_document_ids[b, i] == kv_document_ids[b, j].
  KEEL_MASK_KEY_PADDING = 5,     ///< j < kv_lengths[b].
  KEEL_MASK_BLOCK = 6,           ///< The key block is listed for the query block.
  KEEL_MASK_TENSOR = 7,          ///< tensor[b, h, i, j] is true.
} KEEL_MaskKind;

/// Where queries sit relative to keys (`keel::CausalAlignment`).
typedef enum KEEL_Alignment {
  KEEL_ALIGN_TOP_LEFT = 0,      ///< Query i at position i.
  KEEL_ALIGN_BOTTOM_RIGHT = 1,  ///< Query i at position i + Lk - Lq.
} KEEL_Alignment;

/// One mask term (`keel::Mask`); the fields a kind reads are named there,
/// the others are ignored. Tensors are borrowed inputs.
typedef struct KEEL_Mask {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  int32_t kind;                          ///< A `KEEL_MaskKind`.
  int32_t alignment;                     ///< A `KEEL_Alignment` (default top-left).
  int64_t window_left;                   ///< sliding_window, >= 0.
  int64_t window_right;                  ///< sliding_window, >= 0.
  int64_t chunk_size;                    ///< chunked_causal, > 0.
  const struct DLManagedTensorVersioned* prefix_lengths;   ///< prefix_lm: integer `[B]`.
  const struct DLManagedTensorVersioned* q_document_ids;   ///< document: integer `[B, Lq]`.
  const struct DLManagedTensorVersioned* kv_document_ids;  ///< document: integer `[B, Lk]`.
  const struct DLManagedTensorVersioned* kv_lengths;       ///< key_padding: integer `[B]`.
  const struct DLManagedTensorVersioned* kv_num_blocks;    ///< block: int32 `[B|1, Hq|1, Qb]`.
  const struct DLManagedTensorVersioned* kv_indices;       ///< block: int32 `[B|1, Hq|1, Qb, KVb]`.
  const struct DLManagedTensorVersioned*
      full_kv_num_blocks;  ///< block, optional: int32 `[B|1, Hq|1, Qb]`.
  const struct DLManagedTensorVersioned*
      full_kv_indices;                            ///< block, optional: int32 `[..., Qb, KVb']`.
  int64_t q_block_size;                           ///< block: query rows per block; 0 means 128.
  int64_t kv_block_size;                          ///< block: keys per block; 0 means 128.
  const struct DLManagedTensorVersioned* tensor;  ///< tensor: bool, broadcastable to
                                                  ///< `[B, Hq, Lq, Lk]`.
} KEEL_Mask;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Mask, tensor, tensor);

/// What attention computes (`keel::AttentionSpec`). A NULL spec, or a
/// zeroed one with its `struct_size` set, is plain softmax attention with
/// scale 1/sqrt(E).
typedef struct KEEL_AttentionSpec {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const KEEL_Mask* const* masks;         ///< `num_masks` terms (each sized by its own
                                         ///< `struct_size`), or NULL.
  size_t num_masks;                      ///< How many terms.
  int32_t combine_any;                   ///< 0: a key is visible when every term keeps it;
                                         ///< 1: when any does.
  double scale;                          ///< <= 0 means 1/sqrt(E).
  double softcap;                        ///< tanh soft-capping; 0 is off.
  const struct DLManagedTensorVersioned* alibi_slopes;  ///< Optional float `[Hq]`.
  int32_t alibi_alignment;                              ///< A `KEEL_Alignment` for ALiBi.
  const struct DLManagedTensorVersioned* bias;  ///< Optional additive bias, broadcastable to
                                                ///< `[B, Hq, Lq, Lk]`, q's dtype.
  int32_t backend;                              ///< A `KEEL_Backend`.
} KEEL_AttentionSpec;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_AttentionSpec, backend, backend);

/// Arguments of `KEEL_Attention_Forward`.
typedef struct KEEL_Attention_Forward_Args {
  size_t struct_size;                        ///< This struct's size.
  KEEL_Extension_Base* extension_start;      ///< Extensions, or NULL.
  const struct DLManagedTensorVersioned* q;  ///< `[B, Hq, Lq, E]`.
  const struct DLManagedTensorVersioned* k;  ///< `[B, Hkv, Lk, E]`, Hq % Hkv == 0.
  const struct DLManagedTensorVersioned* v;  ///< `[B, Hkv, Lk, Ev]`.
  const KEEL_AttentionSpec* spec;            ///< The masks and modifiers, or NULL.
  int32_t return_lse;                        ///< Nonzero: also return `lse`.
  void* stream;                              ///< The CUDA stream; NULL for CPU tensors.
  struct DLManagedTensorVersioned* out;      ///< Out: `[B, Hq, Lq, Ev]`, q's dtype.
  struct DLManagedTensorVersioned* lse;      ///< Out: `[B, Hq, Lq]` float32 (float64 for
                                             ///< float64), when `return_lse`; else NULL.
  int32_t served_backend;                    ///< Out: the `KEEL_Backend` that served it.
} KEEL_Attention_Forward_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Attention_Forward_Args, served_backend, served_backend);
/// `keel::attention(q, k, v, spec)`: the same numbers, bitwise, as the C++
/// call of the same plugin's release. Every trap of `keel/v1/attention.h`
/// holds (fully masked rows give 0 and lse -inf).
typedef KEEL_Error* KEEL_Attention_Forward_Fn(KEEL_Attention_Forward_Args* args);

/// Arguments of `KEEL_Attention_Backward`.
typedef struct KEEL_Attention_Backward_Args {
  size_t struct_size;                           ///< This struct's size.
  KEEL_Extension_Base* extension_start;         ///< Extensions, or NULL.
  const struct DLManagedTensorVersioned* q;     ///< As the forward's.
  const struct DLManagedTensorVersioned* k;     ///< As the forward's.
  const struct DLManagedTensorVersioned* v;     ///< As the forward's.
  const KEEL_AttentionSpec* spec;               ///< As the forward's.
  const struct DLManagedTensorVersioned* dout;  ///< The gradient of `out`, `[B, Hq, Lq, Ev]`.
  void* stream;                                 ///< The CUDA stream; NULL for CPU tensors.
  struct DLManagedTensorVersioned* dq;          ///< Out: `[B, Hq, Lq, E]`.
  struct DLManagedTensorVersioned* dk;          ///< Out: `[B, Hkv, Lk, E]`.
  struct DLManagedTensorVersioned* dv;          ///< Out: `[B, Hkv, Lk, Ev]`.
  struct DLManagedTensorVersioned* dbias;       ///< Out: bias's shape, when the spec has a bias.
} KEEL_Attention_Backward_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Attention_Backward_Args, dbias, dbias);
/// The gradients of `sum(out * dout)` with respect to q, k, v and the bias,
/// as `keel::v1`'s autograd gives them. The plugin recomputes the forward
/// (no forward state crosses the boundary in 1.0).
typedef KEEL_Error* KEEL_Attention_Backward_Fn(KEEL_Attention_Backward_Args* args);

/// Arguments of `KEEL_Attention_Paged`.
typedef struct KEEL_Attention_Paged_Args {
  size_t struct_size;                                 ///< This struct's size.
  KEEL_Extension_Base* extension_start;               ///< Extensions, or NULL.
  const struct DLManagedTensorVersioned* q;           ///< `[B, Hq, Lq, E]`.
  const struct DLManagedTensorVersioned* k_pages;     ///< `[P, Hkv, page_size, E]`.
  const struct DLManagedTensorVersioned* v_pages;     ///< `[P, Hkv, page_size, Ev]`.
  const struct DLManagedTensorVersioned* page_table;  ///< Integer `[B, max_pages]`.
  const struct DLManagedTensorVersioned* lengths;     ///< Integer `[B]`.
  const KEEL_AttentionSpec* spec;        ///< Masks and modifiers (no block mask), or NULL.
  int32_t return_lse;                    ///< Nonzero: also return `lse`.
  void* stream;                          ///< The CUDA stream; NULL for CPU tensors.
  struct DLManagedTensorVersioned* out;  ///< Out: `[B, Hq, Lq, Ev]`.
  struct DLManagedTensorVersioned* lse;  ///< Out: `[B, Hq, Lq]` when `return_lse`.
  int32_t served_backend;                ///< Out: the `KEEL_Backend` that served it.
} KEEL_Attention_Paged_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Attention_Paged_Args, served_backend, served_backend);
/// `keel::attention(q, PagedKVCache{...}, spec)`: attention against a paged
/// cache, pages read where they lie (an inference call).
typedef KEEL_Error* KEEL_Attention_Paged_Fn(KEEL_Attention_Paged_Args* args);

/// Arguments of `KEEL_Attention_PackedPaged`.
typedef struct KEEL_Attention_PackedPaged_Args {
  size_t struct_size;                                   ///< This struct's size.
  KEEL_Extension_Base* extension_start;                 ///< Extensions, or NULL.
  const struct DLManagedTensorVersioned* q;             ///< `[T, Hq, E]`: every sequence's queries.
  const struct DLManagedTensorVersioned* cu_seqlens_q;  ///< Integer `[B + 1]` offsets into `q`.
  const struct DLManagedTensorVersioned* k_pages;       ///< `[P, Hkv, page_size, E]`.
  const struct DLManagedTensorVersioned* v_pages;       ///< `[P, Hkv, page_size, Ev]`.
  const struct DLManagedTensorVersioned* page_table;    ///< Integer `[B, max_pages]`.
  const struct DLManagedTensorVersioned* lengths;       ///< Integer `[B]`.
  const KEEL_AttentionSpec* spec;                       ///< Masks and modifiers, or NULL.
  int32_t return_lse;                                   ///< Nonzero: also return `lse`.
  void* stream;                                         ///< The CUDA stream; NULL for CPU tensors.
  struct DLManagedTensorVersioned* out;                 ///< Out: `[T, Hq, Ev]`.
  struct DLManagedTensorVersioned* lse;                 ///< Out: `[T, Hq]` when `return_lse`.
  int32_t served_backend;                               ///< Out: the `KEEL_Backend` that served it.
} KEEL_Attention_PackedPaged_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Attention_PackedPaged_Args, served_backend, served_backend);
/// `keel::attention(PackedQueries{q, cu_seqlens_q}, PagedKVCache{...}, spec)`:
/// a serving step's ragged queries against their paged caches in one call.
typedef KEEL_Error* KEEL_Attention_PackedPaged_Fn(KEEL_Attention_PackedPaged_Args* args);

// ---------------------------------------------------------------- logsumexp

/// Arguments of `KEEL_Logsumexp`.
typedef struct KEEL_Logsumexp_Args {
  size_t struct_size;                            ///< This struct's size.
  KEEL_Extension_Base* extension_start;          ///< Extensions, or NULL.
  const struct DLManagedTensorVersioned* input;  ///< Floating input.
  int64_t dim;                                   ///< The reduced dimension (negative counts
                                                 ///< from the end).
  int32_t keepdim;                               ///< Nonzero: keep it with size 1.
  const struct DLManagedTensorVersioned* mask;   ///< Optional bool, broadcastable to `input`.
  int32_t backend;                               ///< A `KEEL_Backend`.
  struct DLManagedTensorVersioned* value;        ///< Out: the log-sum-exp.
  int32_t served_backend;                        ///< Out: the `KEEL_Backend` that served it.
} KEEL_Logsumexp_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Logsumexp_Args, served_backend, served_backend);
/// `keel::logsumexp(input, {dim, keepdim, mask})`.
typedef KEEL_Error* KEEL_Logsumexp_Fn(KEEL_Logsumexp_Args* args);

// ---------------------------------------------------------------- loss

/// How the per-token losses reduce (`keel::Reduction`).
typedef enum KEEL_Reduction {
  KEEL_REDUCTION_MEAN = 0,  ///< Weighted mean over non-ignored tokens.
  KEEL_REDUCTION_SUM = 1,   ///< Sum.
  KEEL_REDUCTION_NONE = 2,  ///< Per token.
} KEEL_Reduction;

/// The options of the fused loss (`keel::LinearCrossEntropyOptions`). A
/// NULL options pointer, or a zeroed struct with its `struct_size` set, is
/// every default (targets of -100 ignored).
typedef struct KEEL_LinearCrossEntropy_Options {
  size_t struct_size;                                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;                  ///< Extensions, or NULL.
  int32_t reduction;                                     ///< A `KEEL_Reduction` (default mean).
  int32_t has_ignore_index;                              ///< Nonzero: `ignore_index` is set;
                                                         ///< 0: the default, -100.
  int64_t ignore_index;                                  ///< Targets to ignore (0 is a class).
  double label_smoothing;                                ///< In [0, 1].
  const struct DLManagedTensorVersioned* class_weights;  ///< Optional `[V]`.
  double z_loss;                                         ///< z-loss coefficient; 0 is off.
  double logit_softcap;                                  ///< tanh cap of the logits; 0 is off.
  const struct DLManagedTensorVersioned* bias;           ///< Optional `[V]`.
  int64_t chunk_size;                                    ///< Tokens per chunk; 0 chooses.
  int64_t vocab_chunk_size;                              ///< Classes per chunk; 0 chooses.
  int64_t chunk_budget_bytes;     ///< Logit memory per chunk; 0 is the default.
  int32_t return_per_token_loss;  ///< Nonzero: also `per_token_loss`.
  int32_t return_lse;             ///< Nonzero: also `lse`.
  int32_t backend;                ///< A `KEEL_Backend`.
  KEEL_Comm* communicator;        ///< Vocabulary-parallel: the ranks that share the
                                  ///< vocabulary (`weight` holds this rank's rows); NULL:
                                  ///< not sharded.
  int64_t vocab_start;            ///< Vocabulary-parallel: the class of this rank's first row.
} KEEL_LinearCrossEntropy_Options;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_LinearCrossEntropy_Options, vocab_start, vocab_start);

/// Arguments of `KEEL_LinearCrossEntropy_Forward`.
typedef struct KEEL_LinearCrossEntropy_Forward_Args {
  size_t struct_size;                               ///< This struct's size.
  KEEL_Extension_Base* extension_start;             ///< Extensions, or NULL.
  const struct DLManagedTensorVersioned* hidden;    ///< `[N, D]`.
  const struct DLManagedTensorVersioned* weight;    ///< `[V, D]`.
  const struct DLManagedTensorVersioned* target;    ///< Integer `[N]`.
  const KEEL_LinearCrossEntropy_Options* options;   ///< Or NULL.
  struct DLManagedTensorVersioned* loss;            ///< Out: the reduced loss (`[N]` for none).
  struct DLManagedTensorVersioned* per_token_loss;  ///< Out, when asked: `[N]`.
  struct DLManagedTensorVersioned* lse;             ///< Out, when asked: `[N]`.
  int32_t served_backend;                           ///< Out: the `KEEL_Backend` that served it.
} KEEL_LinearCrossEntropy_Forward_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_LinearCrossEntropy_Forward_Args, served_backend, served_backend);
/// `keel::linear_cross_entropy(hidden, weight, target, options)`, forward.
typedef KEEL_Error* KEEL_LinearCrossEntropy_Forward_Fn(KEEL_LinearCrossEntropy_Forward_Args* args);

/// Arguments of `KEEL_LinearCrossEntropy_ForwardBackward`.
typedef struct KEEL_LinearCrossEntropy_ForwardBackward_Args {
  size_t struct_size;                               ///< This struct's size.
  KEEL_Extension_Base* extension_start;             ///< Extensions, or NULL.
  const struct DLManagedTensorVersioned* hidden;    ///< `[N, D]`.
  const struct DLManagedTensorVersioned* weight;    ///< `[V, D]`.
  const struct DLManagedTensorVersioned* target;    ///< Integer `[N]`.
  const KEEL_LinearCrossEntropy_Options* options;   ///< Or NULL.
  const struct DLManagedTensorVersioned* dloss;     ///< The gradient of `loss` (its shape);
                                                    ///< NULL means ones.
  struct DLManagedTensorVersioned* loss;            ///< Out: as the forward's.
  struct DLManagedTensorVersioned* per_token_loss;  ///< Out, when asked.
  struct DLManagedTensorVersioned* lse;             ///< Out, when asked.
  struct DLManagedTensorVersioned* dhidden;         ///< Out: `[N, D]`.
  struct DLManagedTensorVersioned* dweight;         ///< Out: `[V, D]`.
  struct DLManagedTensorVersioned* dbias;           ///< Out: `[V]`, when the options have a bias.
  int32_t served_backend;                           ///< Out: the `KEEL_Backend` that served it.
} KEEL_LinearCrossEntropy_ForwardBackward_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_LinearCrossEntropy_ForwardBackward_Args, served_backend,
                          served_backend);
/// The loss and its gradients with respect to hidden, weight and bias in one
/// call (the fused loss computes them chunk by chunk).
typedef KEEL_Error* KEEL_LinearCrossEntropy_ForwardBackward_Fn(
    KEEL_LinearCrossEntropy_ForwardBackward_Args* args);

// ---------------------------------------------------------------- comm

/// The transport (`keel::comm::CommBackend`).
typedef enum KEEL_CommBackend {
  KEEL_COMM_AUTOMATIC = 0,  ///< gloo for CPU tensors, NCCL for CUDA ones.
  KEEL_COMM_GLOO = 1,       ///< gloo.
  KEEL_COMM_NCCL = 2,       ///< NCCL (a CUDA plugin).
} KEEL_CommBackend;

/// A reduction (`keel::comm::ReduceOp`).
typedef enum KEEL_ReduceOp {
  KEEL_REDUCE_SUM = 0,      ///< Sum.
  KEEL_REDUCE_AVG = 1,      ///< Mean over the ranks.
  KEEL_REDUCE_MIN = 2,      ///< Minimum.
  KEEL_REDUCE_MAX = 3,      ///< Maximum.
  KEEL_REDUCE_PRODUCT = 4,  ///< Product.
} KEEL_ReduceOp;

/// Arguments of `KEEL_Comm_Create` (`keel::comm::CommOptions`). A zeroed
/// struct is every default: the rank and world size from the rendezvous
/// (`RANK`, `WORLD_SIZE`), the first generation from torchrun's restart
/// count.
typedef struct KEEL_Comm_Create_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  int32_t backend;                       ///< A `KEEL_CommBackend`.
  const char* rendezvous;                ///< "env://" (NULL), "tcp://host:port[?store=external]"
                                         ///< or "file://path".
  int32_t world_size;                    ///< The ranks; 0: from the rendezvous.
  int32_t rank;                          ///< This rank, read when `world_size` > 0.
  int64_t timeout_ms;                    ///< Bounds creation and each collective; 0: 300000.
  const char* name;                      ///< The group's name; NULL: "world".
  int32_t checked;                       ///< Nonzero: check collectives' arguments across ranks.
  int64_t heartbeat_interval_ms;         ///< Liveness heartbeat; 0: 100.
  int64_t peer_timeout_ms;               ///< A peer silent this long is lost; 0: 1500.
  int32_t has_generation;                ///< Nonzero: `generation` is set; 0: torchrun's
                                         ///< restart count.
  int32_t generation;                    ///< The first generation.
  int32_t rejoin;                        ///< Nonzero: a restarted rank rejoins the survivors.
  int32_t dispatch_backend;              ///< A `KEEL_Backend`: which adapter serves it.
  KEEL_Comm* comm;                       ///< Out: the communicator.
} KEEL_Comm_Create_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_Create_Args, comm, comm);
/// Rendezvous and creates a communicator (a bounded wait: `timeout_ms`).
typedef KEEL_Error* KEEL_Comm_Create_Fn(KEEL_Comm_Create_Args* args);

/// Arguments of `KEEL_Comm_Destroy`.
typedef struct KEEL_Comm_Destroy_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Comm* comm;                       ///< The handle to free; NULL is a no-op.
} KEEL_Comm_Destroy_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_Destroy_Args, comm, comm);
/// Frees a handle; work in flight keeps what it needs.
typedef KEEL_Error* KEEL_Comm_Destroy_Fn(KEEL_Comm_Destroy_Args* args);

/// Arguments of `KEEL_Comm_Info`.
typedef struct KEEL_Comm_Info_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const KEEL_Comm* comm;                 ///< The communicator.
  int32_t rank;                          ///< Out: this rank.
  int32_t size;                          ///< Out: the ranks.
  int32_t local_rank;                    ///< Out: the rank on this host.
  int32_t generation;                    ///< Out: the generation (after reforms).
  int32_t aborted;                       ///< Out: nonzero once aborted.
  const char* name;                      ///< Out: the group's name, alive as long as `comm`.
} KEEL_Comm_Info_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_Info_Args, name, name);
/// What the communicator is.
typedef KEEL_Error* KEEL_Comm_Info_Fn(KEEL_Comm_Info_Args* args);

/// Arguments of `KEEL_Comm_AllReduce`. Every collective's arguments end
/// alike: `timeout_ms` (0: the communicator's), `async` (nonzero: return at
/// once with `work`; the caller keeps every tensor alive until the work
/// completes) and `work` (out, with `async`). A tensor a collective writes is
/// the caller's memory, written in place, and must not be read-only.
typedef struct KEEL_Comm_AllReduce_Args {
  size_t struct_size;                       ///< This struct's size.
  KEEL_Extension_Base* extension_start;     ///< Extensions, or NULL.
  KEEL_Comm* comm;                          ///< The communicator.
  struct DLManagedTensorVersioned* tensor;  ///< Reduced in place.
  int32_t op;                               ///< A `KEEL_ReduceOp`.
  int64_t timeout_ms;                       ///< This call's bound; 0: the communicator's.
  int32_t async;                            ///< Nonzero: return at once with `work`.
  KEEL_Work* work;                          ///< Out, with `async`: the work in flight.
} KEEL_Comm_AllReduce_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_AllReduce_Args, work, work);
/// All-reduce. A timeout aborts the communicator (`KEEL_ERRC_TIMEOUT`); a
/// dead peer is `KEEL_ERRC_PEER_LOST` naming it (every collective alike).
typedef KEEL_Error* KEEL_Comm_AllReduce_Fn(KEEL_Comm_AllReduce_Args* args);

/// Arguments of `KEEL_Comm_Broadcast`.
typedef struct KEEL_Comm_Broadcast_Args {
  size_t struct_size;                       ///< This struct's size.
  KEEL_Extension_Base* extension_start;     ///< Extensions, or NULL.
  KEEL_Comm* comm;                          ///< The communicator.
  struct DLManagedTensorVersioned* tensor;  ///< Sent from `root`, received in place elsewhere.
  int32_t root;                             ///< The rank that sends.
  int64_t timeout_ms;                       ///< This call's bound; 0: the communicator's.
  int32_t async;                            ///< Nonzero: return at once with `work`.
  KEEL_Work* work;                          ///< Out, with `async`: the work in flight.
} KEEL_Comm_Broadcast_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_Broadcast_Args, work, work);
/// Broadcast from `root`.
typedef KEEL_Error* KEEL_Comm_Broadcast_Fn(KEEL_Comm_Broadcast_Args* args);

/// Arguments of `KEEL_Comm_AllGather`.
typedef struct KEEL_Comm_AllGather_Args {
  size_t struct_size;                            ///< This struct's size.
  KEEL_Extension_Base* extension_start;          ///< Extensions, or NULL.
  KEEL_Comm* comm;                               ///< The communicator.
  struct DLManagedTensorVersioned* output;       ///< Written: `[size * N, ...]`.
  const struct DLManagedTensorVersioned* input;  ///< This rank's `[N, ...]`.
  int64_t timeout_ms;                            ///< This call's bound; 0: the communicator's.
  int32_t async;                                 ///< Nonzero: return at once with `work`.
  KEEL_Work* work;                               ///< Out, with `async`: the work in flight.
} KEEL_Comm_AllGather_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_AllGather_Args, work, work);
/// All-gather into `output`, rank by rank.
typedef KEEL_Error* KEEL_Comm_AllGather_Fn(KEEL_Comm_AllGather_Args* args);

/// Arguments of `KEEL_Comm_ReduceScatter`.
typedef struct KEEL_Comm_ReduceScatter_Args {
  size_t struct_size;                            ///< This struct's size.
  KEEL_Extension_Base* extension_start;          ///< Extensions, or NULL.
  KEEL_Comm* comm;                               ///< The communicator.
  struct DLManagedTensorVersioned* output;       ///< Written: this rank's `[N, ...]`.
  const struct DLManagedTensorVersioned* input;  ///< `[size * N, ...]`.
  int32_t op;                                    ///< A `KEEL_ReduceOp`.
  int64_t timeout_ms;                            ///< This call's bound; 0: the communicator's.
  int32_t async;                                 ///< Nonzero: return at once with `work`.
  KEEL_Work* work;                               ///< Out, with `async`: the work in flight.
} KEEL_Comm_ReduceScatter_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_ReduceScatter_Args, work, work);
/// Reduce-scatter: this rank's block of the reduction of every rank's `input`.
typedef KEEL_Error* KEEL_Comm_ReduceScatter_Fn(KEEL_Comm_ReduceScatter_Args* args);

/// Arguments of `KEEL_Comm_AllToAll`.
typedef struct KEEL_Comm_AllToAll_Args {
  size_t struct_size;                            ///< This struct's size.
  KEEL_Extension_Base* extension_start;          ///< Extensions, or NULL.
  KEEL_Comm* comm;                               ///< The communicator.
  struct DLManagedTensorVersioned* output;       ///< Written: the rows from every rank.
  const struct DLManagedTensorVersioned* input;  ///< The rows to every rank.
  const int64_t* output_splits;                  ///< Rows from each rank, or NULL: even.
  size_t num_output_splits;                      ///< 0 or the ranks.
  const int64_t* input_splits;                   ///< Rows to each rank, or NULL: even.
  size_t num_input_splits;                       ///< 0 or the ranks.
  int64_t timeout_ms;                            ///< This call's bound; 0: the communicator's.
  int32_t async;                                 ///< Nonzero: return at once with `work`.
  KEEL_Work* work;                               ///< Out, with `async`: the work in flight.
} KEEL_Comm_AllToAll_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_AllToAll_Args, work, work);
/// All-to-all, by the splits (or evenly).
typedef KEEL_Error* KEEL_Comm_AllToAll_Fn(KEEL_Comm_AllToAll_Args* args);

/// Arguments of `KEEL_Comm_Send`.
typedef struct KEEL_Comm_Send_Args {
  size_t struct_size;                             ///< This struct's size.
  KEEL_Extension_Base* extension_start;           ///< Extensions, or NULL.
  KEEL_Comm* comm;                                ///< The communicator.
  const struct DLManagedTensorVersioned* tensor;  ///< Sent.
  int32_t peer;                                   ///< The receiving rank.
  int32_t tag;                                    ///< Matches the receive's.
  int64_t timeout_ms;                             ///< This call's bound; 0: the communicator's.
  int32_t async;                                  ///< Nonzero: return at once with `work`.
  KEEL_Work* work;                                ///< Out, with `async`: the work in flight.
} KEEL_Comm_Send_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_Send_Args, work, work);
/// Sends `tensor` to `peer`.
typedef KEEL_Error* KEEL_Comm_Send_Fn(KEEL_Comm_Send_Args* args);

/// Arguments of `KEEL_Comm_Recv`.
typedef struct KEEL_Comm_Recv_Args {
  size_t struct_size;                       ///< This struct's size.
  KEEL_Extension_Base* extension_start;     ///< Extensions, or NULL.
  KEEL_Comm* comm;                          ///< The communicator.
  struct DLManagedTensorVersioned* tensor;  ///< Received into, in place.
  int32_t peer;                             ///< The sending rank.
  int32_t tag;                              ///< Matches the send's.
  int64_t timeout_ms;                       ///< This call's bound; 0: the communicator's.
  int32_t async;                            ///< Nonzero: return at once with `work`.
  KEEL_Work* work;                          ///< Out, with `async`: the work in flight.
} KEEL_Comm_Recv_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_Recv_Args, work, work);
/// Receives into `tensor` from `peer`.
typedef KEEL_Error* KEEL_Comm_Recv_Fn(KEEL_Comm_Recv_Args* args);

/// Arguments of `KEEL_Comm_Barrier`.
typedef struct KEEL_Comm_Barrier_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Comm* comm;                       ///< The communicator.
  int64_t timeout_ms;                    ///< This call's bound; 0: the communicator's.
} KEEL_Comm_Barrier_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_Barrier_Args, timeout_ms, timeout_ms);
/// Waits (bounded) until every rank reaches the barrier.
typedef KEEL_Error* KEEL_Comm_Barrier_Fn(KEEL_Comm_Barrier_Args* args);

/// Arguments of `KEEL_Work_Wait`.
typedef struct KEEL_Work_Wait_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Work* work;                       ///< The work.
  int64_t timeout_ms;                    ///< The bound; 0: the call's.
  int32_t poll;                          ///< Nonzero: do not wait, only report `completed`.
  int32_t completed;                     ///< Out: nonzero when it completed.
} KEEL_Work_Wait_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Work_Wait_Args, completed, completed);
/// Waits (bounded) for an asynchronous collective, or polls it.
typedef KEEL_Error* KEEL_Work_Wait_Fn(KEEL_Work_Wait_Args* args);

/// Arguments of `KEEL_Work_Destroy`.
typedef struct KEEL_Work_Destroy_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Work* work;                       ///< The work to free; NULL is a no-op.
} KEEL_Work_Destroy_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Work_Destroy_Args, work, work);
/// Frees a work handle (the collective itself runs on).
typedef KEEL_Error* KEEL_Work_Destroy_Fn(KEEL_Work_Destroy_Args* args);

/// Arguments of `KEEL_Comm_Split`.
typedef struct KEEL_Comm_Split_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const KEEL_Comm* comm;                 ///< The parent.
  const int32_t* ranks;                  ///< The parent's ranks of the sub-group.
  size_t num_ranks;                      ///< How many.
  const char* name;                      ///< Tells sub-groups apart.
  KEEL_Comm* split;                      ///< Out: the sub-group (called by its members only).
} KEEL_Comm_Split_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_Split_Args, split, split);
/// A sub-group (`Communicator::split`).
typedef KEEL_Error* KEEL_Comm_Split_Fn(KEEL_Comm_Split_Args* args);

/// Arguments of `KEEL_Comm_Reform`.
typedef struct KEEL_Comm_Reform_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const KEEL_Comm* comm;                 ///< The failed world.
  int64_t timeout_ms;                    ///< The bound; 0: the communicator's.
  int32_t wait_for_replacements;         ///< Nonzero: wait for restarted ranks to rejoin.
  KEEL_Comm* reformed;                   ///< Out: the next generation's world.
} KEEL_Comm_Reform_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_Reform_Args, reformed, reformed);
/// After a failure, the survivors form the next generation (`reform()`).
typedef KEEL_Error* KEEL_Comm_Reform_Fn(KEEL_Comm_Reform_Args* args);

/// Arguments of `KEEL_Comm_Abort`.
typedef struct KEEL_Comm_Abort_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Comm* comm;                       ///< The communicator.
} KEEL_Comm_Abort_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Comm_Abort_Args, comm, comm);
/// Aborts the communicator: calls in flight and later fail `KEEL_ERRC_ABORTED`.
typedef KEEL_Error* KEEL_Comm_Abort_Fn(KEEL_Comm_Abort_Args* args);

// ---------------------------------------------------------------- compat

/// A named tensor of a `keel::compat` case. It travels in arrays, so it is
/// frozen: these two fields, forever.
typedef struct KEEL_NamedTensor {
  const char* name;                         ///< The tensor's name.
  struct DLManagedTensorVersioned* tensor;  ///< The tensor.
} KEEL_NamedTensor;

/// One case of a service's function (`keel::compat::Case`).
typedef struct KEEL_Compat_Case {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const char* id;                        ///< Unique in the file.
  const KEEL_NamedTensor* inputs;        ///< Its inputs (borrowed, copied into the file).
  size_t num_inputs;                     ///< How many.
  int32_t has_tolerance;                 ///< Nonzero: judge by `atol`/`rtol`, else the dtype
                                         ///< policy.
  double atol;                           ///< Absolute tolerance (floating outputs).
  double rtol;                           ///< Relative tolerance (floating outputs).
} KEEL_Compat_Case;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Compat_Case, rtol, rtol);

/// What the plugin passes a service's `KEEL_Compat_Function`. The plugin
/// fills it and the function reads it, so the direction is reversed: a
/// function built against a later header checks `struct_size` before it
/// reads a field appended after 1.0.
typedef struct KEEL_Compat_Function_Args {
  size_t struct_size;                    ///< The plugin's size of this struct.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  void* user_data;                       ///< What the caller passed to record or compare.
  const char* case_id;                   ///< The case.
  const KEEL_NamedTensor* inputs;        ///< Its inputs: the plugin's, valid during the call.
  size_t num_inputs;                     ///< How many.
  KEEL_NamedTensor* outputs;             ///< Out: set `outputs[0 .. num_outputs)`; each name is
                                         ///< copied when the call returns, each tensor is then
                                         ///< keel's (which calls its deleter).
  size_t output_capacity;                ///< At most this many outputs.
  size_t num_outputs;                    ///< Out: how many were set.
  char* error;                           ///< Out: a NUL-terminated message with a failing code.
  size_t error_capacity;                 ///< The size of `error`'s buffer.
} KEEL_Compat_Function_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Compat_Function_Args, error_capacity, error_capacity);

/// A service's function, run by record and compare once per case and run,
/// on the caller's thread. It returns `KEEL_ERRC_OK`, or a code with a
/// message in `error`; `KEEL_ERRC_UNSUPPORTED` skips the case.
typedef int32_t KEEL_Compat_Function(KEEL_Compat_Function_Args* args);

/// Arguments of `KEEL_Compat_Record`.
typedef struct KEEL_Compat_Record_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const char* path;                      ///< The golden file to write (safetensors).
  const KEEL_Compat_Case* const* cases;  ///< The cases.
  size_t num_cases;                      ///< How many.
  KEEL_Compat_Function* function;        ///< The service's function.
  void* user_data;                       ///< Passed to `function`.
} KEEL_Compat_Record_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Compat_Record_Args, user_data, user_data);
/// `keel::compat::record`: runs the function on each case and writes inputs,
/// outputs, tolerance, time and peak memory to `path`.
typedef KEEL_Error* KEEL_Compat_Record_Fn(KEEL_Compat_Record_Args* args);

/// Arguments of `KEEL_Compat_Compare`.
typedef struct KEEL_Compat_Compare_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const char* path;                      ///< The golden file.
  KEEL_Compat_Function* function;        ///< The service's function.
  void* user_data;                       ///< Passed to `function`.
  int32_t repeat;                        ///< Runs per case (determinism); 0: 2.
  const char* filter;     ///< Case ids containing any comma-separated part; NULL: all.
  const char* json_path;  ///< Where to write the JSON report, or NULL.
  const char* html_path;  ///< Where to write the HTML report, or NULL.
  int32_t passed;         ///< Out: cases within tolerance, deterministically.
  int32_t failed;         ///< Out: cases that moved (integers exactly).
  int32_t skipped;        ///< Out: cases the function declined.
  int32_t errors;         ///< Out: cases the function failed.
} KEEL_Compat_Compare_Args;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Compat_Compare_Args, errors, errors);
/// `keel::compat::compare`: replays the file's cases through the function on
/// this release and judges every output by the tolerance policy.
typedef KEEL_Error* KEEL_Compat_Compare_Fn(KEEL_Compat_Compare_Args* args);

// ---------------------------------------------------------------- the table

/// The function table a plugin returns. Append-only: a later minor adds
/// pointers at the end, never elsewhere.
typedef struct KEEL_Api {
  // The bootstrap: these three fields are frozen forever, in every major.
  size_t struct_size;                    ///< The table's size: which functions exist.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Api_Version api_version;          ///< The plugin's major and minor.

  // 1.0
  KEEL_Error_Destroy_Fn* KEEL_Error_Destroy;                  ///< Frees an error.
  KEEL_Error_Message_Fn* KEEL_Error_Message;                  ///< An error's message.
  KEEL_Error_GetCode_Fn* KEEL_Error_GetCode;                  ///< An error's code.
  KEEL_Plugin_Info_Fn* KEEL_Plugin_Info;                      ///< What the plugin is.
  KEEL_Capability_Query_Fn* KEEL_Capability_Query;            ///< Typed capabilities.
  KEEL_Attention_Forward_Fn* KEEL_Attention_Forward;          ///< Attention.
  KEEL_Attention_Backward_Fn* KEEL_Attention_Backward;        ///< Attention's gradients.
  KEEL_Attention_Paged_Fn* KEEL_Attention_Paged;              ///< Attention on a paged cache.
  KEEL_Attention_PackedPaged_Fn* KEEL_Attention_PackedPaged;  ///< Ragged queries, paged cache.
  KEEL_Logsumexp_Fn* KEEL_Logsumexp;                          ///< Masked log-sum-exp.
  KEEL_LinearCrossEntropy_Forward_Fn* KEEL_LinearCrossEntropy_Forward;  ///< The fused loss.
  KEEL_LinearCrossEntropy_ForwardBackward_Fn*
      KEEL_LinearCrossEntropy_ForwardBackward;          ///< The fused loss with its gradients.
  KEEL_Comm_Create_Fn* KEEL_Comm_Create;                ///< Creates a communicator.
  KEEL_Comm_Destroy_Fn* KEEL_Comm_Destroy;              ///< Frees a communicator handle.
  KEEL_Comm_Info_Fn* KEEL_Comm_Info;                    ///< What a communicator is.
  KEEL_Comm_AllReduce_Fn* KEEL_Comm_AllReduce;          ///< All-reduce.
  KEEL_Comm_Broadcast_Fn* KEEL_Comm_Broadcast;          ///< Broadcast.
  KEEL_Comm_AllGather_Fn* KEEL_Comm_AllGather;          ///< All-gather.
  KEEL_Comm_ReduceScatter_Fn* KEEL_Comm_ReduceScatter;  ///< Reduce-scatter.
  KEEL_Comm_AllToAll_Fn* KEEL_Comm_AllToAll;            ///< All-to-all.
  KEEL_Comm_Send_Fn* KEEL_Comm_Send;                    ///< Point-to-point send.
  KEEL_Comm_Recv_Fn* KEEL_Comm_Recv;                    ///< Point-to-point receive.
  KEEL_Comm_Barrier_Fn* KEEL_Comm_Barrier;              ///< Barrier.
  KEEL_Work_Wait_Fn* KEEL_Work_Wait;                    ///< Waits for or polls async work.
  KEEL_Work_Destroy_Fn* KEEL_Work_Destroy;              ///< Frees a work handle.
  KEEL_Comm_Split_Fn* KEEL_Comm_Split;                  ///< A sub-group.
  KEEL_Comm_Reform_Fn* KEEL_Comm_Reform;                ///< The survivors' next generation.
  KEEL_Comm_Abort_Fn* KEEL_Comm_Abort;                  ///< Aborts a communicator.
  KEEL_Compat_Record_Fn* KEEL_Compat_Record;            ///< Records a service's function.
  KEEL_Compat_Compare_Fn* KEEL_Compat_Compare;          ///< Replays and judges it.
} KEEL_Api;
KEEL_DEFINE_STRUCT_TRAITS(KEEL_Api, KEEL_Compat_Compare, KEEL_Compat_Compare);

/// The entry point's type.
typedef const KEEL_Api* KEEL_GetApi_Fn(void);

#ifdef __cplusplus
}
#endif

#endif  // KEEL_C_KEEL_H_
// NOLINTEND
