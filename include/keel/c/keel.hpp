/// @file keel/c/keel.hpp
/// @brief A header-only C++ face over keel's C ABI: RAII tensors and
/// plugins, result values like `keel::v1`'s, and no libtorch include.
///
/// For services that hold their own buffers and want one binary for every
/// libtorch release: they include this header (and `keel/c/loader.h`), link
/// `libkeel_loader.so`, and never see a torch header.
///
///     keel::c::LoadOptions options;
///     options.torch_release = "2.15.0";
///     auto plugin = keel::c::Plugin::load(options);
///
/// @snippet examples/c_consumer/consumer.cpp c_face_attention
///
/// A service on libtorch itself crosses with libtorch's own DLPack
/// functions (`ATen/DLConvertor.h`, 2.9+), a few lines:
///
///     DLManagedTensorVersioned* in = at::toDLPackVersioned(q);  // q stays alive
///     keel::c::Tensor view = keel::c::Tensor::adopt(in);        // freed with its deleter
///     at::Tensor out = at::fromDLPackVersioned(result.out.release());
///
/// Traps: every call returns a `Result` marked `[[nodiscard]]`; drop one on
/// purpose with `(void)`. `Tensor::view` borrows the caller's memory, which
/// must outlive the call it is passed to. A `Plugin` is a cheap handle: the
/// plugin stays loaded until the process exits.
#ifndef KEEL_C_KEEL_HPP_
#define KEEL_C_KEEL_HPP_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "keel/c/keel.h"
#include "keel/c/loader.h"

/// The C++ face of keel's C ABI.
namespace keel::c {

/// An error from a plugin or the loader: a `KEEL_Errc` and a message.
class Error {
 public:
  /// A `KEEL_ERRC_BACKEND_ERROR` with no message (result storage needs one).
  Error() = default;
  /// An error with `code` and `message`.
  Error(std::int32_t code, std::string message) : code_(code), message_(std::move(message)) {}
  /// The `KEEL_Errc`.
  std::int32_t code() const noexcept { return code_; }
  /// The message, which names the call and the argument.
  const std::string& message() const noexcept { return message_; }

 private:
  std::int32_t code_ = KEEL_ERRC_BACKEND_ERROR;
  std::string message_;
};

/// A value or an `Error`.
template <class T>
class [[nodiscard]] Result {
 public:
  /// A success.
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit, as keel::v1's result
  /// A failure.
  Result(Error error) : v_(std::move(error)) {}  // NOLINT
  /// Whether it holds a value.
  explicit operator bool() const noexcept { return v_.index() == 0; }
  /// The value (only when it holds one).
  T& value() & { return std::get<0>(v_); }
  /// The value, moved out (only when it holds one).
  T&& value() && { return std::get<0>(std::move(v_)); }
  /// The error (only when it holds one).
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

/// A zeroed C argument struct (every default) with its `struct_size` set.
/// `sizeof` is as good as `<T>_STRUCT_SIZE` here: the padding it adds is
/// zero, the default of any field a later minor puts there.
template <class T>
T make_args() {
  T a;
  std::memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  return a;
}

/// Takes a C call's `KEEL_Error` (NULL: success) into `out` and frees it;
/// true when there was one. For calls the face does not wrap.
inline bool take_error(const KEEL_Api* api, KEEL_Error* error, Error& out) {
  if (error == nullptr) return false;
  auto code = make_args<KEEL_Error_GetCode_Args>();
  code.error = error;
  api->KEEL_Error_GetCode(&code);
  auto message = make_args<KEEL_Error_Message_Args>();
  message.error = error;
  api->KEEL_Error_Message(&message);
  out = Error(code.code, std::string(message.message, message.message_size));
  auto destroy = make_args<KEEL_Error_Destroy_Args>();
  destroy.error = error;
  api->KEEL_Error_Destroy(&destroy);
  return true;
}

/// An owned DLPack tensor: its deleter runs when the `Tensor` goes.
class Tensor {
 public:
  /// No tensor.
  Tensor() = default;
  /// Takes ownership of `managed` (NULL is no tensor).
  static Tensor adopt(DLManagedTensorVersioned* managed) noexcept { return Tensor(managed); }
  /// A borrowed view of the caller's contiguous memory (no copy): the memory
  /// must outlive every call the view is passed to. `read_only` sets
  /// DLPack's read-only flag.
  static Tensor view(const void* data, DLDataType dtype, std::vector<std::int64_t> shape,
                     bool read_only = false) {
    auto* holder = new ViewHolder{};
    holder->shape = std::move(shape);
    DLManagedTensorVersioned& m = holder->managed;
    m.version.major = DLPACK_MAJOR_VERSION;
    m.version.minor = DLPACK_MINOR_VERSION;
    m.manager_ctx = holder;
    m.deleter = [](DLManagedTensorVersioned* self) {
      delete static_cast<ViewHolder*>(self->manager_ctx);
    };
    m.flags = read_only ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
    m.dl_tensor.data = const_cast<void*>(data);
    m.dl_tensor.device = {kDLCPU, 0};
    m.dl_tensor.ndim = static_cast<std::int32_t>(holder->shape.size());
    m.dl_tensor.dtype = dtype;
    m.dl_tensor.shape = holder->shape.data();
    m.dl_tensor.strides = nullptr;
    m.dl_tensor.byte_offset = 0;
    return Tensor(&m);
  }
  Tensor(Tensor&& other) noexcept : t_(std::exchange(other.t_, nullptr)) {}  ///< Moves.
  /// Moves.
  Tensor& operator=(Tensor&& other) noexcept {
    if (this != &other) {
      reset();
      t_ = std::exchange(other.t_, nullptr);
    }
    return *this;
  }
  Tensor(const Tensor&) = delete;             ///< Not copyable.
  Tensor& operator=(const Tensor&) = delete;  ///< Not copyable.
  ~Tensor() { reset(); }                      ///< Runs the deleter.

  /// Whether it holds a tensor.
  explicit operator bool() const noexcept { return t_ != nullptr; }
  /// The DLPack tensor (still owned here).
  DLManagedTensorVersioned* get() const noexcept { return t_; }
  /// Gives up ownership.
  DLManagedTensorVersioned* release() noexcept { return std::exchange(t_, nullptr); }
  /// The sizes.
  std::vector<std::int64_t> shape() const {
    return t_ ? std::vector<std::int64_t>(t_->dl_tensor.shape,
                                          t_->dl_tensor.shape + t_->dl_tensor.ndim)
              : std::vector<std::int64_t>{};
  }
  /// The element count.
  std::int64_t numel() const noexcept {
    std::int64_t n = t_ ? 1 : 0;
    for (std::int32_t d = 0; t_ && d < t_->dl_tensor.ndim; ++d) n *= t_->dl_tensor.shape[d];
    return n;
  }
  /// The dtype.
  DLDataType dtype() const noexcept { return t_ ? t_->dl_tensor.dtype : DLDataType{}; }
  /// The first element (outputs are contiguous).
  template <class T>
  const T* data() const noexcept {
    return t_ ? reinterpret_cast<const T*>(static_cast<const char*>(t_->dl_tensor.data) +
                                           t_->dl_tensor.byte_offset)
              : nullptr;
  }

 private:
  struct ViewHolder {
    DLManagedTensorVersioned managed{};
    std::vector<std::int64_t> shape;
  };
  explicit Tensor(DLManagedTensorVersioned* t) noexcept : t_(t) {}
  void reset() noexcept {
    if (t_ != nullptr && t_->deleter != nullptr) t_->deleter(t_);
    t_ = nullptr;
  }
  DLManagedTensorVersioned* t_ = nullptr;
};

/// A mask term of the C ABI, zeroed with its size set.
inline KEEL_Mask mask(KEEL_MaskKind kind, KEEL_Alignment alignment = KEEL_ALIGN_TOP_LEFT) {
  auto m = make_args<KEEL_Mask>();
  m.kind = kind;
  m.alignment = alignment;
  return m;
}

/// An attention spec that owns its list of mask terms.
class AttentionSpec {
 public:
  /// The default: every key visible, scale 1/sqrt(E).
  AttentionSpec() {
    std::memset(&c_, 0, sizeof c_);
    c_.struct_size = sizeof c_;
  }
  /// Appends a mask term (its tensors are borrowed).
  AttentionSpec& add(const KEEL_Mask& term) {
    masks_.push_back(std::make_unique<KEEL_Mask>(term));
    return *this;
  }
  /// The C struct's other fields (scale, softcap, bias, ...).
  KEEL_AttentionSpec& fields() noexcept { return c_; }
  /// The C struct, valid until this spec changes or goes.
  const KEEL_AttentionSpec* get() {
    pointers_.clear();
    for (const auto& m : masks_) pointers_.push_back(m.get());
    c_.masks = pointers_.empty() ? nullptr : pointers_.data();
    c_.num_masks = pointers_.size();
    return &c_;
  }

 private:
  KEEL_AttentionSpec c_;
  std::vector<std::unique_ptr<KEEL_Mask>> masks_;
  std::vector<const KEEL_Mask*> pointers_;
};

/// Attention's outputs.
struct AttentionResult {
  Tensor out;               ///< `[B, Hq, Lq, Ev]`.
  Tensor lse;               ///< `[B, Hq, Lq]`, when asked.
  std::int32_t served = 0;  ///< The `KEEL_Backend` that served it.
};

/// Attention's gradients.
struct AttentionGradients {
  Tensor dq;     ///< d q.
  Tensor dk;     ///< d k.
  Tensor dv;     ///< d v.
  Tensor dbias;  ///< d bias, when the spec has one.
};

/// The fused loss's outputs (and gradients, from `loss_forward_backward`).
struct LossResult {
  Tensor loss;              ///< The loss.
  Tensor per_token_loss;    ///< When asked.
  Tensor lse;               ///< When asked.
  Tensor dhidden;           ///< d hidden (forward+backward only).
  Tensor dweight;           ///< d weight (forward+backward only).
  Tensor dbias;             ///< d bias (forward+backward only, with a bias).
  std::int32_t served = 0;  ///< The `KEEL_Backend` that served it.
};

/// What a plugin is.
struct PluginInfo {
  std::string keel_version;     ///< keel's version.
  std::string torch_release;    ///< The libtorch it was built on.
  std::string torch_loaded;     ///< The libtorch loaded now.
  std::uint64_t torch_abi = 0;  ///< `aoti_torch_abi_version()`.
  std::string flavour;          ///< "cpu" or the CUDA flavour.
  std::string build_info_json;  ///< `keel-info --json` of the plugin.
  std::uint32_t api_major = 0;  ///< The plugin's C ABI major.
  std::uint32_t api_minor = 0;  ///< The plugin's C ABI minor.
};

/// Frees `work` (the collective itself runs on).
inline void destroy_handle(const KEEL_Api* api, KEEL_Work* work) {
  auto a = make_args<KEEL_Work_Destroy_Args>();
  a.work = work;
  if (Error e; take_error(api, api->KEEL_Work_Destroy(&a), e)) return;  // a valid struct: none
}
/// Frees `comm`.
inline void destroy_handle(const KEEL_Api* api, KEEL_Comm* comm) {
  auto a = make_args<KEEL_Comm_Destroy_Args>();
  a.comm = comm;
  if (Error e; take_error(api, api->KEEL_Comm_Destroy(&a), e)) return;  // a valid struct: none
}

/// A move-only owner of a plugin handle (`KEEL_Work`, `KEEL_Comm`), freed
/// with `destroy_handle` when it goes.
template <class H>
class Handle {
 public:
  /// No handle.
  Handle() = default;
  /// Owns `h`, of the plugin whose table is `api`.
  Handle(const KEEL_Api* api, H* h) noexcept : api_(api), h_(h) {}
  Handle(Handle&& other) noexcept
      : api_(other.api_), h_(std::exchange(other.h_, nullptr)) {}  ///< Moves.
  /// Moves.
  Handle& operator=(Handle&& other) noexcept {
    std::swap(api_, other.api_);
    std::swap(h_, other.h_);
    return *this;
  }
  Handle(const Handle&) = delete;             ///< Not copyable.
  Handle& operator=(const Handle&) = delete;  ///< Not copyable.
  /// Frees the handle.
  ~Handle() {
    if (h_ != nullptr) destroy_handle(api_, h_);
  }
  /// The handle, for the C calls.
  H* get() const noexcept { return h_; }
  /// The plugin's table.
  const KEEL_Api* api() const noexcept { return api_; }

 private:
  const KEEL_Api* api_ = nullptr;
  H* h_ = nullptr;
};

/// An asynchronous collective: wait for it (bounded) before reading or
/// freeing its tensors. Empty after a synchronous call.
class Work : public Handle<KEEL_Work> {
 public:
  using Handle<KEEL_Work>::Handle;
  /// Waits at most `timeout_ms` (0: the call's bound) for it to complete.
  Result<bool> wait(std::int64_t timeout_ms = 0) const { return call(timeout_ms, false); }
  /// Whether it has completed, without waiting.
  Result<bool> poll() const { return call(0, true); }

 private:
  Result<bool> call(std::int64_t timeout_ms, bool poll) const {
    auto a = make_args<KEEL_Work_Wait_Args>();
    a.work = get();
    a.timeout_ms = timeout_ms;
    a.poll = poll;
    if (Error e; take_error(api(), api()->KEEL_Work_Wait(&a), e)) return e;
    return a.completed != 0;
  }
};

/// A communicator (`keel::comm::Communicator` behind the C ABI). Each
/// collective takes its own C arguments; `a.comm` is set here, and with
/// `a.async` the result holds the work in flight.
class Comm : public Handle<KEEL_Comm> {
 public:
  using Handle<KEEL_Comm>::Handle;
  /// Rendezvous and creation (`KEEL_Comm_Create`); `args` from
  /// `make_args` (a zeroed struct is every default).
  static Result<Comm> create(const KEEL_Api* api, KEEL_Comm_Create_Args args) {
    if (Error e; take_error(api, api->KEEL_Comm_Create(&args), e)) return e;
    return Comm(api, args.comm);
  }
  /// Rank, size, generation and name.
  Result<KEEL_Comm_Info_Args> info() const {
    auto a = make_args<KEEL_Comm_Info_Args>();
    a.comm = get();
    if (Error e; take_error(api(), api()->KEEL_Comm_Info(&a), e)) return e;
    return a;
  }
  /// All-reduce.
  Result<Work> run(KEEL_Comm_AllReduce_Args a) const { return run(a, api()->KEEL_Comm_AllReduce); }
  /// Broadcast.
  Result<Work> run(KEEL_Comm_Broadcast_Args a) const { return run(a, api()->KEEL_Comm_Broadcast); }
  /// All-gather.
  Result<Work> run(KEEL_Comm_AllGather_Args a) const { return run(a, api()->KEEL_Comm_AllGather); }
  /// Reduce-scatter.
  Result<Work> run(KEEL_Comm_ReduceScatter_Args a) const {
    return run(a, api()->KEEL_Comm_ReduceScatter);
  }
  /// All-to-all.
  Result<Work> run(KEEL_Comm_AllToAll_Args a) const { return run(a, api()->KEEL_Comm_AllToAll); }
  /// Send.
  Result<Work> run(KEEL_Comm_Send_Args a) const { return run(a, api()->KEEL_Comm_Send); }
  /// Receive.
  Result<Work> run(KEEL_Comm_Recv_Args a) const { return run(a, api()->KEEL_Comm_Recv); }
  /// Barrier.
  Result<Work> run(KEEL_Comm_Barrier_Args a) const {
    a.comm = get();
    if (Error e; take_error(api(), api()->KEEL_Comm_Barrier(&a), e)) return e;
    return Work();
  }
  /// all_reduce of `tensor` in place.
  Result<Work> all_reduce(const Tensor& tensor, KEEL_ReduceOp op = KEEL_REDUCE_SUM,
                          bool async = false) const {
    auto a = make_args<KEEL_Comm_AllReduce_Args>();
    a.tensor = tensor.get();
    a.op = op;
    a.async = async;
    return run(a);
  }
  /// A sub-group of the given ranks (called by its members).
  Result<Comm> split(const std::vector<std::int32_t>& ranks, const std::string& name) const {
    auto a = make_args<KEEL_Comm_Split_Args>();
    a.comm = get();
    a.ranks = ranks.data();
    a.num_ranks = ranks.size();
    a.name = name.c_str();
    if (Error e; take_error(api(), api()->KEEL_Comm_Split(&a), e)) return e;
    return Comm(api(), a.split);
  }
  /// The survivors' next generation, after a failure.
  Result<Comm> reform(std::int64_t timeout_ms = 0, bool wait_for_replacements = false) const {
    auto a = make_args<KEEL_Comm_Reform_Args>();
    a.comm = get();
    a.timeout_ms = timeout_ms;
    a.wait_for_replacements = wait_for_replacements;
    if (Error e; take_error(api(), api()->KEEL_Comm_Reform(&a), e)) return e;
    return Comm(api(), a.reformed);
  }
  /// Aborts: calls in flight and later fail with `KEEL_ERRC_ABORTED`.
  Result<bool> abort() const {
    auto a = make_args<KEEL_Comm_Abort_Args>();
    a.comm = get();
    if (Error e; take_error(api(), api()->KEEL_Comm_Abort(&a), e)) return e;
    return true;
  }

 private:
  template <class Args, class Fn>
  Result<Work> run(Args a, Fn* fn) const {
    a.comm = get();
    if (Error e; take_error(api(), fn(&a), e)) return e;
    return Work(api(), a.work);
  }
};

/// Where to find a plugin (`KEEL_LoadOptions`).
struct LoadOptions {
  std::string torch_release;  ///< Find the plugin of this release ("2.15.0").
  std::string plugin_path;    ///< Or this file (else `KEEL_PLUGIN`).
  std::string flavour;        ///< "cpu" when empty.
  std::string plugin_dir;     ///< Where to look (else `KEEL_PLUGIN_DIR`, else the loader's folder).
  std::string torch_library_dir;  ///< The plugin's libtorch (else `KEEL_TORCH_LIBRARY_DIR`).
};

/// A loaded plugin: a handle on its function table.
class Plugin {
 public:
  /// Finds, checks and loads a plugin (`keel_load_plugin`).
  static Result<Plugin> load(const LoadOptions& options) {
    char error[1024] = {0};
    auto o = make_args<KEEL_LoadOptions>();
    o.plugin_path = options.plugin_path.empty() ? nullptr : options.plugin_path.c_str();
    o.torch_release = options.torch_release.empty() ? nullptr : options.torch_release.c_str();
    o.flavour = options.flavour.empty() ? nullptr : options.flavour.c_str();
    o.plugin_dir = options.plugin_dir.empty() ? nullptr : options.plugin_dir.c_str();
    o.torch_library_dir =
        options.torch_library_dir.empty() ? nullptr : options.torch_library_dir.c_str();
    o.error = error;
    o.error_capacity = sizeof error;
    const std::int32_t code = keel_load_plugin(&o);
    if (code != KEEL_ERRC_OK) return Error(code, error);
    return Plugin(o.api, o.resolved_path);
  }

  /// A communicator; `args` from `make_args<KEEL_Comm_Create_Args>()`
  /// (every default: rank and world size from the rendezvous), adjusted.
  Result<Comm> create_comm(const KEEL_Comm_Create_Args& args) const {
    return Comm::create(api_, args);
  }

  /// The table, for calls the face does not wrap.
  const KEEL_Api* api() const noexcept { return api_; }
  /// The file it was loaded from.
  const std::string& path() const noexcept { return path_; }

  /// What the plugin is.
  Result<PluginInfo> info() const {
    auto a = make_args<KEEL_Plugin_Info_Args>();
    if (Error e; failed(api_->KEEL_Plugin_Info(&a), e)) return e;
    return PluginInfo{
        a.keel_version, a.torch_release,   a.torch_loaded,          a.torch_abi_version,
        a.flavour,      a.build_info_json, api_->api_version.major, api_->api_version.minor};
  }

  /// Whether some adapter serves `operation` for `dtype` on the CPU; the
  /// adapter's name, or "" when none does.
  Result<std::string> serves(KEEL_Operation operation, DLDataType dtype,
                             KEEL_Backend backend = KEEL_BACKEND_UNSET) const {
    auto a = make_args<KEEL_Capability_Query_Args>();
    a.operation = operation;
    a.backend = backend;
    a.dtype = dtype;
    a.device_type = kDLCPU;
    if (Error e; failed(api_->KEEL_Capability_Query(&a), e)) return e;
    return std::string(a.supported ? a.adapter : "");
  }

  /// `keel::attention(q, k, v, spec)`; `spec` may be NULL. `stream`: the
  /// `cudaStream_t` a CUDA call runs on (a CUDA plugin; NULL: libtorch's
  /// current stream), NULL for CPU tensors.
  Result<AttentionResult> attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const KEEL_AttentionSpec* spec, bool return_lse = false,
                                    void* stream = nullptr) const {
    auto a = make_args<KEEL_Attention_Forward_Args>();
    a.stream = stream;
    a.q = q.get();
    a.k = k.get();
    a.v = v.get();
    a.spec = spec;
    a.return_lse = return_lse;
    if (Error e; failed(api_->KEEL_Attention_Forward(&a), e)) return e;
    return AttentionResult{Tensor::adopt(a.out), Tensor::adopt(a.lse), a.served_backend};
  }

  /// Attention's gradients for `dout`; `stream` as for attention().
  Result<AttentionGradients> attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const KEEL_AttentionSpec* spec, const Tensor& dout,
                                                void* stream = nullptr) const {
    auto a = make_args<KEEL_Attention_Backward_Args>();
    a.stream = stream;
    a.q = q.get();
    a.k = k.get();
    a.v = v.get();
    a.spec = spec;
    a.dout = dout.get();
    if (Error e; failed(api_->KEEL_Attention_Backward(&a), e)) return e;
    return AttentionGradients{Tensor::adopt(a.dq), Tensor::adopt(a.dk), Tensor::adopt(a.dv),
                              Tensor::adopt(a.dbias)};
  }

  /// Attention against a paged cache; `stream` as for attention().
  Result<AttentionResult> attention_paged(const Tensor& q, const Tensor& k_pages,
                                          const Tensor& v_pages, const Tensor& page_table,
                                          const Tensor& lengths, const KEEL_AttentionSpec* spec,
                                          bool return_lse = false, void* stream = nullptr) const {
    auto a = make_args<KEEL_Attention_Paged_Args>();
    a.stream = stream;
    a.q = q.get();
    a.k_pages = k_pages.get();
    a.v_pages = v_pages.get();
    a.page_table = page_table.get();
    a.lengths = lengths.get();
    a.spec = spec;
    a.return_lse = return_lse;
    if (Error e; failed(api_->KEEL_Attention_Paged(&a), e)) return e;
    return AttentionResult{Tensor::adopt(a.out), Tensor::adopt(a.lse), a.served_backend};
  }

  /// Packed ragged queries `[T, Hq, E]` (offsets `cu_seqlens_q`) against a
  /// paged cache: a serving step in one call; `stream` as for attention().
  Result<AttentionResult> attention_packed_paged(const Tensor& q, const Tensor& cu_seqlens_q,
                                                 const Tensor& k_pages, const Tensor& v_pages,
                                                 const Tensor& page_table, const Tensor& lengths,
                                                 const KEEL_AttentionSpec* spec,
                                                 bool return_lse = false,
                                                 void* stream = nullptr) const {
    auto a = make_args<KEEL_Attention_PackedPaged_Args>();
    a.stream = stream;
    a.q = q.get();
    a.cu_seqlens_q = cu_seqlens_q.get();
    a.k_pages = k_pages.get();
    a.v_pages = v_pages.get();
    a.page_table = page_table.get();
    a.lengths = lengths.get();
    a.spec = spec;
    a.return_lse = return_lse;
    if (Error e; failed(api_->KEEL_Attention_PackedPaged(&a), e)) return e;
    return AttentionResult{Tensor::adopt(a.out), Tensor::adopt(a.lse), a.served_backend};
  }

  /// `keel::logsumexp(input, {dim, keepdim, mask})`; `mask` may be empty.
  Result<Tensor> logsumexp(const Tensor& input, std::int64_t dim, bool keepdim = false,
                           const Tensor& mask = Tensor()) const {
    auto a = make_args<KEEL_Logsumexp_Args>();
    a.input = input.get();
    a.dim = dim;
    a.keepdim = keepdim;
    a.mask = mask.get();
    if (Error e; failed(api_->KEEL_Logsumexp(&a), e)) return e;
    return Tensor::adopt(a.value);
  }

  /// The fused loss, forward only; `options` may be NULL (every default).
  Result<LossResult> loss_forward(const Tensor& hidden, const Tensor& weight, const Tensor& target,
                                  const KEEL_LinearCrossEntropy_Options* options) const {
    auto a = make_args<KEEL_LinearCrossEntropy_Forward_Args>();
    a.hidden = hidden.get();
    a.weight = weight.get();
    a.target = target.get();
    a.options = options;
    if (Error e; failed(api_->KEEL_LinearCrossEntropy_Forward(&a), e)) return e;
    LossResult r;
    r.loss = Tensor::adopt(a.loss);
    r.per_token_loss = Tensor::adopt(a.per_token_loss);
    r.lse = Tensor::adopt(a.lse);
    r.served = a.served_backend;
    return r;
  }

  /// The fused loss and its gradients; `dloss` empty means ones.
  Result<LossResult> loss_forward_backward(const Tensor& hidden, const Tensor& weight,
                                           const Tensor& target,
                                           const KEEL_LinearCrossEntropy_Options* options,
                                           const Tensor& dloss = Tensor()) const {
    auto a = make_args<KEEL_LinearCrossEntropy_ForwardBackward_Args>();
    a.hidden = hidden.get();
    a.weight = weight.get();
    a.target = target.get();
    a.options = options;
    a.dloss = dloss.get();
    if (Error e; failed(api_->KEEL_LinearCrossEntropy_ForwardBackward(&a), e)) return e;
    LossResult r;
    r.loss = Tensor::adopt(a.loss);
    r.per_token_loss = Tensor::adopt(a.per_token_loss);
    r.lse = Tensor::adopt(a.lse);
    r.dhidden = Tensor::adopt(a.dhidden);
    r.dweight = Tensor::adopt(a.dweight);
    r.dbias = Tensor::adopt(a.dbias);
    r.served = a.served_backend;
    return r;
  }

 private:
  Plugin(const KEEL_Api* api, const char* path) : api_(api), path_(path ? path : "") {}
  bool failed(KEEL_Error* error, Error& out) const { return take_error(api_, error, out); }
  const KEEL_Api* api_;
  std::string path_;
};

}  // namespace keel::c

#endif  // KEEL_C_KEEL_HPP_
