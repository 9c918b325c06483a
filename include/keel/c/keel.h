/// @file keel/c/keel.h
/// @brief keel's C ABI: one service binary for every supported libtorch
/// release.
///
/// A service compiled against this header (and DLPack's `dlpack.h`, its only
/// dependency) runs unchanged on every release that has a keel plugin: the
/// loader (`keel/c/loader.h`) opens the plugin built for the libtorch the
/// process uses, and every call goes through the function table it returns.
/// No C++ type and no exception crosses; the header compiles as C11 and as
/// C++17/20. `docs/c-api.md` is the manual.
///
/// The rules, after PJRT's C API (openxla `pjrt_c_api.h`):
/// - **One entry point.** A plugin exports `keel_plugin_get_api()`
///   (`KEEL_PLUGIN_ENTRY_POINT`), which returns a `KEEL_Api`: a table of
///   function pointers that only grows (new functions are appended).
/// - **Size first.** Every argument struct starts with `struct_size`; set it
///   with `KEEL_STRUCT_SIZE(type, last_field)` or `sizeof`. A plugin reads
///   only the fields that both it and the caller know: an older (smaller)
///   struct leaves the newer fields at their defaults, a newer (larger) one
///   has its extra fields ignored. A struct smaller than its first release's
///   is `KEEL_ERRC_INVALID_ARGUMENT`.
/// - **Versions.** `KEEL_C_API_MAJOR` changes when a function or field is
///   removed, retyped or moved (a loader refuses a plugin of another major);
///   `KEEL_C_API_MINOR` when a function or field is appended. A caller that
///   needs a function of minor N checks `api_version.minor >= N` (or the
///   table's `struct_size`) before calling it. The first three fields of
///   `KEEL_Api` (the bootstrap) never change, in any major.
/// - **Extensions.** Optional features hang off `extension_start` as a chain
///   of `KEEL_Extension_Base`, each typed and sized; a caller checks the
///   type and size before use. None is defined in 0.1.
/// - **Errors.** A call returns NULL on success or a `KEEL_Error*` that the
///   caller owns and frees with `KEEL_Error_Destroy`; it carries keel's
///   `Errc` (`KEEL_Errc`, the same values as `keel::Errc`) and a message
///   naming the argument. Bad input, including a NULL pointer, a tensor of
///   the wrong dtype or a struct too small, is an error value, never a
///   crash.
///
/// Tensors cross as DLPack 1.x `DLManagedTensorVersioned`:
/// - **Inputs are borrowed.** The plugin reads them in place (no copy but the
///   one "Any layout" names) for the duration of the call and never calls
///   their deleter; the caller keeps them alive until the call returns. keel
///   never writes an input, so an input flagged
///   `DLPACK_FLAG_BITMASK_READ_ONLY` is fine anywhere. An input of another
///   DLPack major version is `KEEL_ERRC_INVALID_ARGUMENT`.
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
///   CPU tensors (`KEEL_ERRC_INVALID_ARGUMENT`) and for a collective, which
///   c10d orders after the work queued on its tensors' current stream.
///
/// What crosses in 0.1: build information and typed capabilities; attention
/// forward with every mask and modifier, its explicit backward (no autograd
/// graph crosses a C boundary, as in FlashAttention's API) and the paged-cache
/// call, also over packed ragged queries; logsumexp; linear cross-entropy forward and
/// forward+backward, also vocabulary-parallel; the communicator (created by environment, URL or
/// options; every collective, sync and async with bounded waits; abort,
/// reform, rejoin, split); and `keel::compat` record/compare over C
/// callbacks. Left out, with the reason: the flight recorder's dump and
/// `dedicated()` (diagnostics and a tuning aid, reachable through keel::v1;
/// they add no capability a service needs to run), and `DispatchInfo`'s
/// reason text (the served backend crosses as a value).
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
#define KEEL_C_API_MAJOR 0
/// The C ABI's minor version: appended functions and fields.
#define KEEL_C_API_MINOR 1

/// The symbol every plugin exports (`const KEEL_Api* keel_plugin_get_api(void)`).
#define KEEL_PLUGIN_ENTRY_POINT "keel_plugin_get_api"

/// The size of `type` up to and including `last_field`: what a caller of an
/// older header would put in `struct_size`.
#define KEEL_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

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
/// `KEEL_Comm_Destroy`. Its calls may come from several threads, as v1's.
typedef struct KEEL_Comm KEEL_Comm;

/// The head of every extension in a chain.
typedef struct KEEL_Extension_Base {
  size_t struct_size;                ///< The extension's size.
  uint32_t type;                     ///< Which extension (none defined in 0.1).
  struct KEEL_Extension_Base* next;  ///< The next in the chain, or NULL.
} KEEL_Extension_Base;

/// A version of the C ABI.
typedef struct KEEL_Api_Version {
  size_t struct_size;  ///< `KEEL_STRUCT_SIZE(KEEL_Api_Version, minor)`.
  uint32_t major;      ///< `KEEL_C_API_MAJOR` the plugin was built with.
  uint32_t minor;      ///< `KEEL_C_API_MINOR` the plugin was built with.
} KEEL_Api_Version;

// ---------------------------------------------------------------- errors

/// Arguments of `KEEL_Error_Destroy`.
typedef struct KEEL_Error_Destroy_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Error* error;                     ///< The error to free; NULL is a no-op.
} KEEL_Error_Destroy_Args;
/// Frees an error.
typedef void KEEL_Error_Destroy_Fn(KEEL_Error_Destroy_Args* args);

/// Arguments of `KEEL_Error_Message`.
typedef struct KEEL_Error_Message_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const KEEL_Error* error;               ///< The error.
  const char* message;                   ///< Out: NUL-terminated, alive as long as `error`.
  size_t message_size;                   ///< Out: its length without the NUL.
} KEEL_Error_Message_Args;
/// The error's message, which names the call and the argument.
typedef void KEEL_Error_Message_Fn(KEEL_Error_Message_Args* args);

/// Arguments of `KEEL_Error_GetCode`.
typedef struct KEEL_Error_GetCode_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  const KEEL_Error* error;               ///< The error.
  int32_t code;                          ///< Out: a `KEEL_Errc`.
} KEEL_Error_GetCode_Args;
/// The error's code.
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
                                         ///< (its version file), "" when it cannot be read.
  uint64_t torch_abi_version;   ///< Out: `aoti_torch_abi_version()` of the loaded libtorch.
  const char* flavour;          ///< Out: "cpu", or the CUDA flavour ("cu132").
  const char* build_info_json;  ///< Out: `keel-info --json` of the plugin.
} KEEL_Plugin_Info_Args;
/// What the plugin is and which libtorch it runs on.
typedef KEEL_Error* KEEL_Plugin_Info_Fn(KEEL_Plugin_Info_Args* args);

/// The operations a capability query names.
typedef enum KEEL_Operation {
  KEEL_OPERATION_ATTENTION = 0,             ///< `KEEL_Attention_*`.
  KEEL_OPERATION_LINEAR_CROSS_ENTROPY = 1,  ///< `KEEL_LinearCrossEntropy_*`.
  KEEL_OPERATION_LOGSUMEXP = 2,             ///< `KEEL_Logsumexp`.
  KEEL_OPERATION_COMM = 3,                  ///< The communicator (served by keel::v1 only in 0.1).
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
  size_t struct_size;                                ///< This struct's size.
  int32_t kind;                                      ///< A `KEEL_MaskKind`.
  int32_t alignment;                                 ///< A `KEEL_Alignment` (position-based kinds).
  int64_t window_left;                               ///< sliding_window, >= 0.
  int64_t window_right;                              ///< sliding_window, >= 0.
  int64_t chunk_size;                                ///< chunked_causal, > 0.
  struct DLManagedTensorVersioned* prefix_lengths;   ///< prefix_lm: integer `[B]`.
  struct DLManagedTensorVersioned* q_document_ids;   ///< document: integer `[B, Lq]`.
  struct DLManagedTensorVersioned* kv_document_ids;  ///< document: integer `[B, Lk]`.
  struct DLManagedTensorVersioned* kv_lengths;       ///< key_padding: integer `[B]`.
  struct DLManagedTensorVersioned* kv_num_blocks;    ///< block: int32 `[B|1, Hq|1, Qb]`.
  struct DLManagedTensorVersioned* kv_indices;       ///< block: int32 `[B|1, Hq|1, Qb, KVb]`.
  struct DLManagedTensorVersioned*
      full_kv_num_blocks;                            ///< block, optional: int32 `[B|1, Hq|1, Qb]`.
  struct DLManagedTensorVersioned* full_kv_indices;  ///< block, optional: int32 `[..., Qb, KVb']`.
  int64_t q_block_size;                              ///< block: query rows per block; 0 means 128.
  int64_t kv_block_size;                             ///< block: keys per block; 0 means 128.
  struct DLManagedTensorVersioned* tensor;  ///< tensor: bool, broadcastable to `[B, Hq, Lq, Lk]`.
} KEEL_Mask;

/// What attention computes (`keel::AttentionSpec`). A NULL spec, or a
/// zeroed one with its `struct_size` set, is plain softmax attention with
/// scale 1/sqrt(E).
typedef struct KEEL_AttentionSpec {
  size_t struct_size;                             ///< This struct's size.
  KEEL_Extension_Base* extension_start;           ///< Extensions, or NULL.
  const KEEL_Mask* const* masks;                  ///< `num_masks` terms (each sized by its own
                                                  ///< `struct_size`), or NULL.
  size_t num_masks;                               ///< How many terms.
  int32_t combine_any;                            ///< 0: a key is visible when every term keeps it;
                                                  ///< 1: when any does.
  double scale;                                   ///< <= 0 means 1/sqrt(E).
  double softcap;                                 ///< tanh soft-capping; 0 is off.
  struct DLManagedTensorVersioned* alibi_slopes;  ///< Optional float `[Hq]`.
  int32_t alibi_alignment;                        ///< A `KEEL_Alignment` for ALiBi.
  struct DLManagedTensorVersioned* bias;          ///< Optional additive bias, broadcastable to
                                                  ///< `[B, Hq, Lq, Lk]`, q's dtype.
  int32_t backend;                                ///< A `KEEL_Backend`.
} KEEL_AttentionSpec;

/// Arguments of `KEEL_Attention_Forward`.
typedef struct KEEL_Attention_Forward_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  struct DLManagedTensorVersioned* q;    ///< `[B, Hq, Lq, E]`.
  struct DLManagedTensorVersioned* k;    ///< `[B, Hkv, Lk, E]`, Hq % Hkv == 0.
  struct DLManagedTensorVersioned* v;    ///< `[B, Hkv, Lk, Ev]`.
  const KEEL_AttentionSpec* spec;        ///< The masks and modifiers, or NULL.
  int32_t return_lse;                    ///< Nonzero: also return `lse`.
  void* stream;                          ///< The CUDA stream; NULL for CPU tensors.
  struct DLManagedTensorVersioned* out;  ///< Out: `[B, Hq, Lq, Ev]`, q's dtype.
  struct DLManagedTensorVersioned* lse;  ///< Out: `[B, Hq, Lq]` float32 (float64 for
                                         ///< float64), when `return_lse`; else NULL.
  int32_t served_backend;                ///< Out: the `KEEL_Backend` that served it.
} KEEL_Attention_Forward_Args;
/// `keel::attention(q, k, v, spec)`: the same numbers, bitwise, as the C++
/// call of the same plugin's release. Every trap of `keel/v1/attention.h`
/// holds (fully masked rows give 0 and lse -inf).
typedef KEEL_Error* KEEL_Attention_Forward_Fn(KEEL_Attention_Forward_Args* args);

/// Arguments of `KEEL_Attention_Backward`.
typedef struct KEEL_Attention_Backward_Args {
  size_t struct_size;                      ///< This struct's size.
  KEEL_Extension_Base* extension_start;    ///< Extensions, or NULL.
  struct DLManagedTensorVersioned* q;      ///< As the forward's.
  struct DLManagedTensorVersioned* k;      ///< As the forward's.
  struct DLManagedTensorVersioned* v;      ///< As the forward's.
  const KEEL_AttentionSpec* spec;          ///< As the forward's.
  struct DLManagedTensorVersioned* dout;   ///< The gradient of `out`, `[B, Hq, Lq, Ev]`.
  void* stream;                            ///< The CUDA stream; NULL for CPU tensors.
  struct DLManagedTensorVersioned* dq;     ///< Out: `[B, Hq, Lq, E]`.
  struct DLManagedTensorVersioned* dk;     ///< Out: `[B, Hkv, Lk, E]`.
  struct DLManagedTensorVersioned* dv;     ///< Out: `[B, Hkv, Lk, Ev]`.
  struct DLManagedTensorVersioned* dbias;  ///< Out: bias's shape, when the spec has a bias.
} KEEL_Attention_Backward_Args;
/// The gradients of `sum(out * dout)` with respect to q, k, v and the bias,
/// as `keel::v1`'s autograd gives them. The plugin recomputes the forward
/// (no forward state crosses the boundary in 0.1).
typedef KEEL_Error* KEEL_Attention_Backward_Fn(KEEL_Attention_Backward_Args* args);

/// Arguments of `KEEL_Attention_Paged`.
typedef struct KEEL_Attention_Paged_Args {
  size_t struct_size;                           ///< This struct's size.
  KEEL_Extension_Base* extension_start;         ///< Extensions, or NULL.
  struct DLManagedTensorVersioned* q;           ///< `[B, Hq, Lq, E]`.
  struct DLManagedTensorVersioned* k_pages;     ///< `[P, Hkv, page_size, E]`.
  struct DLManagedTensorVersioned* v_pages;     ///< `[P, Hkv, page_size, Ev]`.
  struct DLManagedTensorVersioned* page_table;  ///< Integer `[B, max_pages]`.
  struct DLManagedTensorVersioned* lengths;     ///< Integer `[B]`.
  const KEEL_AttentionSpec* spec;               ///< Masks and modifiers (no block mask), or NULL.
  int32_t return_lse;                           ///< Nonzero: also return `lse`.
  void* stream;                                 ///< The CUDA stream; NULL for CPU tensors.
  struct DLManagedTensorVersioned* out;         ///< Out: `[B, Hq, Lq, Ev]`.
  struct DLManagedTensorVersioned* lse;         ///< Out: `[B, Hq, Lq]` when `return_lse`.
  int32_t served_backend;                       ///< Out: the `KEEL_Backend` that served it.
} KEEL_Attention_Paged_Args;
/// `keel::attention(q, PagedKVCache{...}, spec)`: attention against a paged
/// cache, pages read where they lie (an inference call).
typedef KEEL_Error* KEEL_Attention_Paged_Fn(KEEL_Attention_Paged_Args* args);

/// Arguments of `KEEL_Attention_PackedPaged`.
typedef struct KEEL_Attention_PackedPaged_Args {
  size_t struct_size;                             ///< This struct's size.
  KEEL_Extension_Base* extension_start;           ///< Extensions, or NULL.
  struct DLManagedTensorVersioned* q;             ///< `[T, Hq, E]`: every sequence's queries.
  struct DLManagedTensorVersioned* cu_seqlens_q;  ///< Integer `[B + 1]` offsets into `q`.
  struct DLManagedTensorVersioned* k_pages;       ///< `[P, Hkv, page_size, E]`.
  struct DLManagedTensorVersioned* v_pages;       ///< `[P, Hkv, page_size, Ev]`.
  struct DLManagedTensorVersioned* page_table;    ///< Integer `[B, max_pages]`.
  struct DLManagedTensorVersioned* lengths;       ///< Integer `[B]`.
  const KEEL_AttentionSpec* spec;                 ///< Masks and modifiers, or NULL.
  int32_t return_lse;                             ///< Nonzero: also return `lse`.
  void* stream;                                   ///< The CUDA stream; NULL for CPU tensors.
  struct DLManagedTensorVersioned* out;           ///< Out: `[T, Hq, Ev]`.
  struct DLManagedTensorVersioned* lse;           ///< Out: `[T, Hq]` when `return_lse`.
  int32_t served_backend;                         ///< Out: the `KEEL_Backend` that served it.
} KEEL_Attention_PackedPaged_Args;
/// `keel::attention(PackedQueries{q, cu_seqlens_q}, PagedKVCache{...}, spec)`:
/// a serving step's ragged queries against their paged caches in one call.
typedef KEEL_Error* KEEL_Attention_PackedPaged_Fn(KEEL_Attention_PackedPaged_Args* args);

// ---------------------------------------------------------------- logsumexp

/// Arguments of `KEEL_Logsumexp`.
typedef struct KEEL_Logsumexp_Args {
  size_t struct_size;                      ///< This struct's size.
  KEEL_Extension_Base* extension_start;    ///< Extensions, or NULL.
  struct DLManagedTensorVersioned* input;  ///< Floating input.
  int64_t dim;                            ///< The reduced dimension (negative counts from the end).
  int32_t keepdim;                        ///< Nonzero: keep it with size 1.
  struct DLManagedTensorVersioned* mask;  ///< Optional bool, broadcastable to `input`.
  int32_t backend;                        ///< A `KEEL_Backend`.
  struct DLManagedTensorVersioned* value;  ///< Out: the log-sum-exp.
  int32_t served_backend;                  ///< Out: the `KEEL_Backend` that served it.
} KEEL_Logsumexp_Args;
/// `keel::logsumexp(input, {dim, keepdim, mask})`.
typedef KEEL_Error* KEEL_Logsumexp_Fn(KEEL_Logsumexp_Args* args);

// ---------------------------------------------------------------- loss

/// How the per-token losses reduce (`keel::Reduction`).
typedef enum KEEL_Reduction {
  KEEL_REDUCTION_MEAN = 0,  ///< Weighted mean over non-ignored tokens.
  KEEL_REDUCTION_SUM = 1,   ///< Sum.
  KEEL_REDUCTION_NONE = 2,  ///< Per token.
} KEEL_Reduction;

/// The options of the fused loss (`keel::LinearCrossEntropyOptions`); a
/// NULL options pointer means every default.
typedef struct KEEL_LinearCrossEntropy_Options {
  size_t struct_size;                              ///< This struct's size.
  KEEL_Extension_Base* extension_start;            ///< Extensions, or NULL.
  int32_t reduction;                               ///< A `KEEL_Reduction` (default mean).
  int64_t ignore_index;                            ///< Targets to ignore (keel's default is -100:
                                                   ///< set it; 0 is a valid class).
  double label_smoothing;                          ///< In [0, 1].
  struct DLManagedTensorVersioned* class_weights;  ///< Optional `[V]`.
  double z_loss;                                   ///< z-loss coefficient; 0 is off.
  double logit_softcap;                            ///< tanh cap of the logits; 0 is off.
  struct DLManagedTensorVersioned* bias;           ///< Optional `[V]`.
  int64_t chunk_size;                              ///< Tokens per chunk; 0 chooses.
  int64_t vocab_chunk_size;                        ///< Classes per chunk; 0 chooses.
  int64_t chunk_budget_bytes;                      ///< Logit memory per chunk; 0 is the default.
  int32_t return_per_token_loss;                   ///< Nonzero: also `per_token_loss`.
  int32_t return_lse;                              ///< Nonzero: also `lse`.
  int32_t backend;                                 ///< A `KEEL_Backend`.
  KEEL_Comm* communicator;  ///< Vocabulary-parallel: the ranks that share the vocabulary
                            ///< (`weight` holds this rank's rows); NULL: not sharded.
  int64_t vocab_start;      ///< Vocabulary-parallel: the class of this rank's first row.
} KEEL_LinearCrossEntropy_Options;

/// Arguments of `KEEL_LinearCrossEntropy_Forward`.
typedef struct KEEL_LinearCrossEntropy_Forward_Args {
  size_t struct_size;                               ///< This struct's size.
  KEEL_Extension_Base* extension_start;             ///< Extensions, or NULL.
  struct DLManagedTensorVersioned* hidden;          ///< `[N, D]`.
  struct DLManagedTensorVersioned* weight;          ///< `[V, D]`.
  struct DLManagedTensorVersioned* target;          ///< Integer `[N]`.
  const KEEL_LinearCrossEntropy_Options* options;   ///< Or NULL.
  struct DLManagedTensorVersioned* loss;            ///< Out: the reduced loss (`[N]` for none).
  struct DLManagedTensorVersioned* per_token_loss;  ///< Out, when asked: `[N]`.
  struct DLManagedTensorVersioned* lse;             ///< Out, when asked: `[N]`.
  int32_t served_backend;                           ///< Out: the `KEEL_Backend` that served it.
} KEEL_LinearCrossEntropy_Forward_Args;
/// `keel::linear_cross_entropy(hidden, weight, target, options)`, forward.
typedef KEEL_Error* KEEL_LinearCrossEntropy_Forward_Fn(KEEL_LinearCrossEntropy_Forward_Args* args);

/// Arguments of `KEEL_LinearCrossEntropy_ForwardBackward`.
typedef struct KEEL_LinearCrossEntropy_ForwardBackward_Args {
  size_t struct_size;                              ///< This struct's size.
  KEEL_Extension_Base* extension_start;            ///< Extensions, or NULL.
  struct DLManagedTensorVersioned* hidden;         ///< `[N, D]`.
  struct DLManagedTensorVersioned* weight;         ///< `[V, D]`.
  struct DLManagedTensorVersioned* target;         ///< Integer `[N]`.
  const KEEL_LinearCrossEntropy_Options* options;  ///< Or NULL.
  struct DLManagedTensorVersioned* dloss;  ///< The gradient of `loss` (its shape); NULL means ones.
  struct DLManagedTensorVersioned* loss;   ///< Out: as the forward's.
  struct DLManagedTensorVersioned* per_token_loss;  ///< Out, when asked.
  struct DLManagedTensorVersioned* lse;             ///< Out, when asked.
  struct DLManagedTensorVersioned* dhidden;         ///< Out: `[N, D]`.
  struct DLManagedTensorVersioned* dweight;         ///< Out: `[V, D]`.
  struct DLManagedTensorVersioned* dbias;           ///< Out: `[V]`, when the options have a bias.
  int32_t served_backend;                           ///< Out: the `KEEL_Backend` that served it.
} KEEL_LinearCrossEntropy_ForwardBackward_Args;
/// The loss and its gradients with respect to hidden, weight and bias in one
/// call (the fused loss computes them chunk by chunk).
typedef KEEL_Error* KEEL_LinearCrossEntropy_ForwardBackward_Fn(
    KEEL_LinearCrossEntropy_ForwardBackward_Args* args);

// ---------------------------------------------------------------- comm

/// An asynchronous collective in flight: freed with `KEEL_Work_Destroy`.
typedef struct KEEL_Work KEEL_Work;

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

/// Which collective `KEEL_Comm_Collective` runs, and the tensors it uses.
typedef enum KEEL_Collective {
  KEEL_COLLECTIVE_ALL_REDUCE = 0,      ///< `tensor`, in place, with `op`.
  KEEL_COLLECTIVE_ALL_GATHER = 1,      ///< `input` into `output` ([size * N, ...]).
  KEEL_COLLECTIVE_REDUCE_SCATTER = 2,  ///< `input` ([size * N, ...]) into `output`, with `op`.
  KEEL_COLLECTIVE_BROADCAST = 3,       ///< `tensor` from rank `peer`, in place.
  KEEL_COLLECTIVE_ALL_TO_ALL = 4,      ///< `input` into `output`, by the splits (or evenly).
  KEEL_COLLECTIVE_SEND = 5,            ///< `tensor` to rank `peer` with `tag`.
  KEEL_COLLECTIVE_RECV = 6,            ///< Into `tensor` from rank `peer` with `tag`.
  KEEL_COLLECTIVE_BARRIER = 7,         ///< No tensor.
} KEEL_Collective;

/// Arguments of `KEEL_Comm_Create` (`keel::comm::CommOptions`). Zero means
/// the default of every field but `rank`, `world_size` and `generation`,
/// where -1 does (the C++ face sets them so).
typedef struct KEEL_Comm_Create_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  int32_t backend;                       ///< A `KEEL_CommBackend`.
  const char* rendezvous;                ///< "env://" (NULL), "tcp://host:port[?store=external]"
                                         ///< or "file://path".
  int32_t rank;                          ///< This rank; -1: from the rendezvous (`RANK`).
  int32_t world_size;                    ///< The ranks; -1: from the rendezvous (`WORLD_SIZE`).
  int64_t timeout_ms;                    ///< Bounds creation and each collective; 0: 300000.
  const char* name;                      ///< The group's name; NULL: "world".
  int32_t checked;                       ///< Nonzero: check collectives' arguments across ranks.
  int64_t heartbeat_interval_ms;         ///< Liveness heartbeat; 0: 100.
  int64_t peer_timeout_ms;               ///< A peer silent this long is lost; 0: 1500.
  int32_t generation;                    ///< The first generation; -1: torchrun's restart count.
  int32_t rejoin;                        ///< Nonzero: a restarted rank rejoins the survivors.
  int32_t dispatch_backend;              ///< A `KEEL_Backend`: which adapter serves it.
  KEEL_Comm* comm;                       ///< Out: the communicator.
} KEEL_Comm_Create_Args;
/// Rendezvous and creates a communicator (a bounded wait: `timeout_ms`).
typedef KEEL_Error* KEEL_Comm_Create_Fn(KEEL_Comm_Create_Args* args);

/// Arguments of `KEEL_Comm_Destroy`.
typedef struct KEEL_Comm_Destroy_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Comm* comm;                       ///< The handle to free; NULL is a no-op.
} KEEL_Comm_Destroy_Args;
/// Frees a handle; work in flight keeps what it needs.
typedef void KEEL_Comm_Destroy_Fn(KEEL_Comm_Destroy_Args* args);

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
/// What the communicator is.
typedef KEEL_Error* KEEL_Comm_Info_Fn(KEEL_Comm_Info_Args* args);

/// Arguments of `KEEL_Comm_Collective`. Tensors the collective writes
/// (`tensor` of all_reduce, broadcast and recv; `output`) are the caller's
/// memory, written in place, and must not be read-only. With `async`, the
/// caller keeps every tensor alive until the work completes.
typedef struct KEEL_Comm_Collective_Args {
  size_t struct_size;                       ///< This struct's size.
  KEEL_Extension_Base* extension_start;     ///< Extensions, or NULL.
  KEEL_Comm* comm;                          ///< The communicator.
  int32_t collective;                       ///< A `KEEL_Collective`.
  struct DLManagedTensorVersioned* tensor;  ///< In place (see `KEEL_Collective`).
  struct DLManagedTensorVersioned* output;  ///< Written.
  struct DLManagedTensorVersioned* input;   ///< Read.
  int32_t op;                               ///< A `KEEL_ReduceOp`.
  int32_t peer;                             ///< The root (broadcast) or peer (send, recv).
  int32_t tag;                              ///< send/recv's tag.
  const int64_t* output_splits;             ///< all_to_all: rows from each rank, or NULL.
  size_t num_output_splits;                 ///< 0 or the ranks.
  const int64_t* input_splits;              ///< all_to_all: rows to each rank, or NULL.
  size_t num_input_splits;                  ///< 0 or the ranks.
  int64_t timeout_ms;                       ///< This call's bound; 0: the communicator's.
  int32_t async;                            ///< Nonzero: return at once with `work`.
  void* stream;                             ///< Must be NULL (see "Devices and streams").
  KEEL_Work* work;                          ///< Out, with `async`: the work in flight.
} KEEL_Comm_Collective_Args;
/// Runs one collective. A timeout aborts the communicator
/// (`KEEL_ERRC_TIMEOUT`); a dead peer is `KEEL_ERRC_PEER_LOST` naming it.
typedef KEEL_Error* KEEL_Comm_Collective_Fn(KEEL_Comm_Collective_Args* args);

/// Arguments of `KEEL_Work_Wait`.
typedef struct KEEL_Work_Wait_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Work* work;                       ///< The work.
  int64_t timeout_ms;                    ///< The bound; 0: the call's.
  int32_t completed;                     ///< Out: nonzero when it completed (also on a
                                         ///< poll: set `poll`).
  int32_t poll;                          ///< Nonzero: do not wait, only report `completed`.
} KEEL_Work_Wait_Args;
/// Waits (bounded) for an asynchronous collective, or polls it.
typedef KEEL_Error* KEEL_Work_Wait_Fn(KEEL_Work_Wait_Args* args);

/// Arguments of `KEEL_Work_Destroy`.
typedef struct KEEL_Work_Destroy_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Work* work;                       ///< The work to free; NULL is a no-op.
} KEEL_Work_Destroy_Args;
/// Frees a work handle (the collective itself runs on).
typedef void KEEL_Work_Destroy_Fn(KEEL_Work_Destroy_Args* args);

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
/// After a failure, the survivors form the next generation (`reform()`).
typedef KEEL_Error* KEEL_Comm_Reform_Fn(KEEL_Comm_Reform_Args* args);

/// Arguments of `KEEL_Comm_Abort`.
typedef struct KEEL_Comm_Abort_Args {
  size_t struct_size;                    ///< This struct's size.
  KEEL_Extension_Base* extension_start;  ///< Extensions, or NULL.
  KEEL_Comm* comm;                       ///< The communicator.
} KEEL_Comm_Abort_Args;
/// Aborts the communicator: calls in flight and later fail `KEEL_ERRC_ABORTED`.
typedef void KEEL_Comm_Abort_Fn(KEEL_Comm_Abort_Args* args);

// ---------------------------------------------------------------- compat

/// A named tensor of a `keel::compat` case.
typedef struct KEEL_NamedTensor {
  const char* name;                         ///< The tensor's name.
  struct DLManagedTensorVersioned* tensor;  ///< The tensor.
} KEEL_NamedTensor;

/// One case of a service's function (`keel::compat::Case`).
typedef struct KEEL_Compat_Case {
  size_t struct_size;              ///< This struct's size.
  const char* id;                  ///< Unique in the file.
  const KEEL_NamedTensor* inputs;  ///< Its inputs (borrowed, copied into the file).
  size_t num_inputs;               ///< How many.
  int32_t has_tolerance;           ///< Nonzero: judge by `atol`/`rtol`, else the dtype policy.
  double atol;                     ///< Absolute tolerance (floating outputs).
  double rtol;                     ///< Relative tolerance (floating outputs).
} KEEL_Compat_Case;

/// A service's function, run by record and compare once per case and run,
/// on the caller's thread. `inputs` are the plugin's, valid during the call.
/// It sets `outputs[0 .. *num_outputs)` (at most `output_capacity`): each
/// name is copied when the call returns, each tensor is then owned by keel
/// (which calls its deleter). It returns `KEEL_ERRC_OK`, or a code with a
/// message in `error`; `KEEL_ERRC_UNSUPPORTED` skips the case.
typedef int32_t KEEL_Compat_Function(void* user_data, const char* case_id,
                                     const KEEL_NamedTensor* inputs, size_t num_inputs,
                                     KEEL_NamedTensor* outputs, size_t output_capacity,
                                     size_t* num_outputs, char* error, size_t error_capacity);

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

  // 0.1
  KEEL_Error_Destroy_Fn* KEEL_Error_Destroy;            ///< Frees an error.
  KEEL_Error_Message_Fn* KEEL_Error_Message;            ///< An error's message.
  KEEL_Error_GetCode_Fn* KEEL_Error_GetCode;            ///< An error's code.
  KEEL_Plugin_Info_Fn* KEEL_Plugin_Info;                ///< What the plugin is.
  KEEL_Capability_Query_Fn* KEEL_Capability_Query;      ///< Typed capabilities.
  KEEL_Attention_Forward_Fn* KEEL_Attention_Forward;    ///< Attention.
  KEEL_Attention_Backward_Fn* KEEL_Attention_Backward;  ///< Attention's gradients.
  KEEL_Attention_Paged_Fn* KEEL_Attention_Paged;        ///< Attention on a paged cache.
  KEEL_Logsumexp_Fn* KEEL_Logsumexp;                    ///< Masked log-sum-exp.
  KEEL_LinearCrossEntropy_Forward_Fn* KEEL_LinearCrossEntropy_Forward;  ///< The fused loss.
  KEEL_LinearCrossEntropy_ForwardBackward_Fn* KEEL_LinearCrossEntropy_ForwardBackward;
  ///< The fused loss with its gradients.
  KEEL_Comm_Create_Fn* KEEL_Comm_Create;                      ///< Creates a communicator.
  KEEL_Comm_Destroy_Fn* KEEL_Comm_Destroy;                    ///< Frees a communicator handle.
  KEEL_Comm_Info_Fn* KEEL_Comm_Info;                          ///< What a communicator is.
  KEEL_Comm_Collective_Fn* KEEL_Comm_Collective;              ///< Runs a collective.
  KEEL_Work_Wait_Fn* KEEL_Work_Wait;                          ///< Waits for or polls async work.
  KEEL_Work_Destroy_Fn* KEEL_Work_Destroy;                    ///< Frees a work handle.
  KEEL_Comm_Split_Fn* KEEL_Comm_Split;                        ///< A sub-group.
  KEEL_Comm_Reform_Fn* KEEL_Comm_Reform;                      ///< The survivors' next generation.
  KEEL_Comm_Abort_Fn* KEEL_Comm_Abort;                        ///< Aborts a communicator.
  KEEL_Compat_Record_Fn* KEEL_Compat_Record;                  ///< Records a service's function.
  KEEL_Compat_Compare_Fn* KEEL_Compat_Compare;                ///< Replays and judges it.
  KEEL_Attention_PackedPaged_Fn* KEEL_Attention_PackedPaged;  ///< Ragged queries, paged cache.
} KEEL_Api;

/// The entry point's type.
typedef const KEEL_Api* KEEL_GetApi_Fn(void);

#ifdef __cplusplus
}
#endif

#endif  // KEEL_C_KEEL_H_
// NOLINTEND
