// What every room of the plugin shares (include/keel/c/keel.h's rules made
// code): the opaque types, errors, sized reads of the caller's structs, the
// borrowed inputs of one call, and outputs that are all-or-nothing and never
// written past the caller's struct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dlpack_bridge.h"
#include "keel/c/keel.h"
#include "keel/keel.h"

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

// Each argument struct's name and first-release size, from the header's
// KEEL_DEFINE_STRUCT_TRAITS (the size is written once, there).
template <class T>
struct Traits;
#define KEEL_PLUGIN_TRAITS(T)                             \
  template <>                                             \
  struct Traits<T> {                                      \
    static constexpr std::size_t min_size = T##_MIN_SIZE; \
    static constexpr const char* name = #T;               \
  }
KEEL_PLUGIN_TRAITS(KEEL_Error_Destroy_Args);
KEEL_PLUGIN_TRAITS(KEEL_Error_Message_Args);
KEEL_PLUGIN_TRAITS(KEEL_Error_GetCode_Args);
KEEL_PLUGIN_TRAITS(KEEL_Plugin_Info_Args);
KEEL_PLUGIN_TRAITS(KEEL_Capability_Query_Args);
KEEL_PLUGIN_TRAITS(KEEL_Mask);
KEEL_PLUGIN_TRAITS(KEEL_AttentionSpec);
KEEL_PLUGIN_TRAITS(KEEL_Attention_Forward_Args);
KEEL_PLUGIN_TRAITS(KEEL_Attention_Backward_Args);
KEEL_PLUGIN_TRAITS(KEEL_Attention_Paged_Args);
KEEL_PLUGIN_TRAITS(KEEL_Attention_PackedPaged_Args);
KEEL_PLUGIN_TRAITS(KEEL_Logsumexp_Args);
KEEL_PLUGIN_TRAITS(KEEL_LinearCrossEntropy_Options);
KEEL_PLUGIN_TRAITS(KEEL_LinearCrossEntropy_Forward_Args);
KEEL_PLUGIN_TRAITS(KEEL_LinearCrossEntropy_ForwardBackward_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_Create_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_Destroy_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_Info_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_AllReduce_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_Broadcast_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_AllGather_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_ReduceScatter_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_AllToAll_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_Send_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_Recv_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_Barrier_Args);
KEEL_PLUGIN_TRAITS(KEEL_Work_Wait_Args);
KEEL_PLUGIN_TRAITS(KEEL_Work_Destroy_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_Split_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_Reform_Args);
KEEL_PLUGIN_TRAITS(KEEL_Comm_Abort_Args);
KEEL_PLUGIN_TRAITS(KEEL_Compat_Case);
KEEL_PLUGIN_TRAITS(KEEL_Compat_Record_Args);
KEEL_PLUGIN_TRAITS(KEEL_Compat_Compare_Args);
#undef KEEL_PLUGIN_TRAITS

// Handed out when allocating an error fails; never freed.
KEEL_Error* out_of_memory() noexcept;

KEEL_Error* make_error(std::int32_t code, std::string message) noexcept;
KEEL_Error* to_c(const Error& e);

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

// Whether `in` is there and at least its first release's size.
template <class T>
result<void> check_size(const T* in, const std::string& name) {
  if (in == nullptr) return Error(Errc::invalid_argument, name + " is NULL");
  if (in->struct_size < Traits<T>::min_size) {
    return Error(Errc::invalid_argument,
                 name + ".struct_size is " + std::to_string(in->struct_size) +
                     ", smaller than its first release's " + std::to_string(Traits<T>::min_size));
  }
  return success();
}

// The caller's struct, as this plugin's: the fields both know copied, the
// rest zero (every field's default).
template <class T>
result<T> sized(const T* in, const std::string& name = Traits<T>::name) {
  if (result<void> ok = check_size(in, name); !ok) return ok.error();
  T out{};
  std::memcpy(static_cast<void*>(&out), in, std::min<std::size_t>(in->struct_size, sizeof(T)));
  out.struct_size = sizeof(T);
  return out;
}

// A call's outputs: staged, then handed over together by commit(), each
// only when the caller's struct covers its field. Until then the caller's
// output fields are zero, and what was staged is freed if the call fails.
template <class Args>
class Outputs {
 public:
  // Zeroes `fields` where the caller's struct (checked by sized()) has them.
  template <class... F>
  explicit Outputs(Args* args, F Args::*... fields) : args_(args), size_(args->struct_size) {
    (write(offset_of(fields), sizeof(F), nullptr), ...);
    staged_.reserve(sizeof...(F));
  }
  Outputs(const Outputs&) = delete;
  Outputs& operator=(const Outputs&) = delete;
  ~Outputs() {
    for (Staged& s : staged_) {
      if (s.release) s.release();
    }
  }

  // A plain value (a code, a count, a string the plugin owns).
  template <class F, class V>
  void set(F Args::*field, V value) {
    stage(field, static_cast<F>(value), nullptr);
  }
  // A caller-owned tensor (NULL stays NULL).
  void tensor(DLManagedTensorVersioned* Args::*field, DLManagedTensorVersioned* t) {
    stage(field, t, [t] {
      if (t != nullptr && t->deleter != nullptr) t->deleter(t);
    });
  }
  // A caller-owned handle.
  template <class H>
  void handle(H* Args::*field, std::unique_ptr<H> h) {
    H* raw = h.release();
    stage(field, raw, [raw] { delete raw; });
  }
  // Hands every staged output over; one the caller's struct cannot hold is
  // freed instead. Returns NULL, the call's success.
  KEEL_Error* commit() {
    for (Staged& s : staged_) {
      if (s.offset + s.size <= size_) {
        write(s.offset, s.size, s.bytes);
      } else if (s.release) {
        s.release();
      }
      s.release = nullptr;
    }
    staged_.clear();
    return nullptr;
  }

 private:
  struct Staged {
    std::size_t offset;
    std::size_t size;
    unsigned char bytes[sizeof(std::uint64_t)];
    std::function<void()> release;  // frees it while the caller does not own it
  };
  template <class F>
  static std::size_t offset_of(F Args::*field) {
    static const Args probe{};
    return static_cast<std::size_t>(reinterpret_cast<const char*>(&(probe.*field)) -
                                    reinterpret_cast<const char*>(&probe));
  }
  template <class F>
  void stage(F Args::*field, F value, std::function<void()> release) {
    static_assert(sizeof(F) <= sizeof(std::uint64_t), "an output field is a scalar or pointer");
    Staged s{offset_of(field), sizeof(F), {}, nullptr};
    std::memcpy(s.bytes, &value, sizeof(F));
    staged_.push_back(std::move(s));
    staged_.back().release = std::move(release);
  }
  // Writes `size` bytes at `offset` of the caller's struct (zeros for
  // NULL), only inside it.
  void write(std::size_t offset, std::size_t size, const unsigned char* bytes) {
    if (offset + size > size_) return;
    char* at = reinterpret_cast<char*>(args_) + offset;
    if (bytes == nullptr) {
      std::memset(at, 0, size);
    } else {
      std::memcpy(at, bytes, size);
    }
  }

  Args* args_;
  std::size_t size_;
  std::vector<Staged> staged_;
};

result<Backend> backend_of(std::int32_t b, const std::string& name);
std::int32_t served(const DispatchInfo& d);
result<CausalAlignment> alignment_of(std::int32_t a, const std::string& name);

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
// The same inside a function that returns a result<T>: the error passes on.
#define KEEL_TRY_RESULT(var, expr)      \
  auto var##_r = (expr);                \
  if (!var##_r) return var##_r.error(); \
  auto var = std::move(var##_r).value()
// NOLINTEND(bugprone-macro-parentheses)

// The entry points, one room per section of the header; plugin.cpp puts
// them in the table.
void error_destroy(KEEL_Error_Destroy_Args* args) noexcept;
void error_message(KEEL_Error_Message_Args* args) noexcept;
void error_get_code(KEEL_Error_GetCode_Args* args) noexcept;
KEEL_Error* plugin_info(KEEL_Plugin_Info_Args* args) noexcept;
KEEL_Error* capability_query(KEEL_Capability_Query_Args* args) noexcept;
KEEL_Error* attention_forward(KEEL_Attention_Forward_Args* args) noexcept;
KEEL_Error* attention_backward(KEEL_Attention_Backward_Args* args) noexcept;
KEEL_Error* attention_paged(KEEL_Attention_Paged_Args* args) noexcept;
KEEL_Error* attention_packed_paged(KEEL_Attention_PackedPaged_Args* args) noexcept;
KEEL_Error* logsumexp_call(KEEL_Logsumexp_Args* args) noexcept;
KEEL_Error* loss_forward(KEEL_LinearCrossEntropy_Forward_Args* args) noexcept;
KEEL_Error* loss_forward_backward(KEEL_LinearCrossEntropy_ForwardBackward_Args* args) noexcept;
KEEL_Error* comm_create(KEEL_Comm_Create_Args* args) noexcept;
KEEL_Error* comm_destroy(KEEL_Comm_Destroy_Args* args) noexcept;
KEEL_Error* comm_info(KEEL_Comm_Info_Args* args) noexcept;
KEEL_Error* comm_all_reduce(KEEL_Comm_AllReduce_Args* args) noexcept;
KEEL_Error* comm_broadcast(KEEL_Comm_Broadcast_Args* args) noexcept;
KEEL_Error* comm_all_gather(KEEL_Comm_AllGather_Args* args) noexcept;
KEEL_Error* comm_reduce_scatter(KEEL_Comm_ReduceScatter_Args* args) noexcept;
KEEL_Error* comm_all_to_all(KEEL_Comm_AllToAll_Args* args) noexcept;
KEEL_Error* comm_send(KEEL_Comm_Send_Args* args) noexcept;
KEEL_Error* comm_recv(KEEL_Comm_Recv_Args* args) noexcept;
KEEL_Error* comm_barrier(KEEL_Comm_Barrier_Args* args) noexcept;
KEEL_Error* work_wait(KEEL_Work_Wait_Args* args) noexcept;
KEEL_Error* work_destroy(KEEL_Work_Destroy_Args* args) noexcept;
KEEL_Error* comm_split(KEEL_Comm_Split_Args* args) noexcept;
KEEL_Error* comm_reform(KEEL_Comm_Reform_Args* args) noexcept;
KEEL_Error* comm_abort(KEEL_Comm_Abort_Args* args) noexcept;
KEEL_Error* compat_record(KEEL_Compat_Record_Args* args) noexcept;
KEEL_Error* compat_compare(KEEL_Compat_Compare_Args* args) noexcept;

}  // namespace keel::c_api
