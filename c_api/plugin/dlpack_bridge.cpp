#include "dlpack_bridge.h"

#include <cstdint>
#include <limits>
#include <new>
#include <optional>

#include <ATen/ATen.h>

#include "device.h"

namespace keel::c_api {
namespace {

Error bad(const std::string& name, const std::string& what) {
  return {Errc::invalid_argument, name + ": " + what};
}

std::optional<at::ScalarType> scalar_type(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 16) return at::kHalf;
      if (t.bits == 32) return at::kFloat;
      if (t.bits == 64) return at::kDouble;
      break;
    case kDLBfloat:
      if (t.bits == 16) return at::kBFloat16;
      break;
    case kDLInt:
      if (t.bits == 8) return at::kChar;
      if (t.bits == 16) return at::kShort;
      if (t.bits == 32) return at::kInt;
      if (t.bits == 64) return at::kLong;
      break;
    case kDLUInt:
      if (t.bits == 8) return at::kByte;
      break;
    case kDLBool:
      if (t.bits == 8) return at::kBool;
      break;
    default:
      break;
  }
  return std::nullopt;
}

DLDataType dl_type(at::ScalarType t) {
  switch (t) {
    case at::kHalf:
      return {kDLFloat, 16, 1};
    case at::kFloat:
      return {kDLFloat, 32, 1};
    case at::kDouble:
      return {kDLFloat, 64, 1};
    case at::kBFloat16:
      return {kDLBfloat, 16, 1};
    case at::kChar:
      return {kDLInt, 8, 1};
    case at::kShort:
      return {kDLInt, 16, 1};
    case at::kInt:
      return {kDLInt, 32, 1};
    case at::kLong:
      return {kDLInt, 64, 1};
    case at::kByte:
      return {kDLUInt, 8, 1};
    case at::kBool:
      return {kDLBool, 8, 1};
    default:
      break;
  }
  throw std::invalid_argument(std::string("keel's C ABI has no DLPack type for ") +
                              c10::toString(t));
}

struct Holder {
  DLManagedTensorVersioned managed{};
  at::Tensor tensor;
  std::vector<std::int64_t> shape, strides;
};

void delete_holder(DLManagedTensorVersioned* self) {
  if (self != nullptr) delete static_cast<Holder*>(self->manager_ctx);
}

}  // namespace

result<at::Tensor> from_dlpack(const DLManagedTensorVersioned* managed, const std::string& name,
                               bool optional) {
  if (managed == nullptr) {
    if (optional) return at::Tensor();
    return bad(name, "is NULL");
  }
  if (managed->version.major != DLPACK_MAJOR_VERSION) {
    return bad(name, "is DLPack " + std::to_string(managed->version.major) + "." +
                         std::to_string(managed->version.minor) + "; keel reads DLPack " +
                         std::to_string(DLPACK_MAJOR_VERSION) + ".x");
  }
  const DLTensor& t = managed->dl_tensor;
  const std::optional<at::ScalarType> type = scalar_type(t.dtype);
  if (!type) {
    return bad(name, "has DLPack dtype (code " + std::to_string(t.dtype.code) + ", bits " +
                         std::to_string(t.dtype.bits) + ", lanes " + std::to_string(t.dtype.lanes) +
                         "), which keel does not take");
  }
  if (t.device.device_type == kDLCUDA && !serves_device(kDLCUDA)) {
    return Error(Errc::unsupported,
                 name + " is a CUDA tensor; this keel plugin serves CPU tensors");
  }
  if (!serves_device(t.device.device_type)) {
    return bad(name, "is on DLPack device type " + std::to_string(t.device.device_type) +
                         "; keel takes kDLCPU and, in a CUDA plugin, kDLCUDA");
  }
  if (t.device.device_id < 0 || t.device.device_id > std::numeric_limits<std::int8_t>::max()) {
    return bad(name, "is on device " + std::to_string(t.device.device_id));
  }
  const at::Device device =
      t.device.device_type == kDLCUDA
          ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(t.device.device_id))
          : at::Device(at::kCPU);
  if (t.ndim < 0 || t.ndim > 64) return bad(name, "has ndim " + std::to_string(t.ndim));
  if (t.ndim > 0 && t.shape == nullptr) return bad(name, "has no shape");
  std::vector<std::int64_t> sizes(t.shape, t.shape + t.ndim);
  std::int64_t numel = 1;
  for (std::int64_t s : sizes) {
    if (s < 0) return bad(name, "has a negative size");
    if (s != 0 && numel > std::numeric_limits<std::int64_t>::max() / s) {
      return bad(name, "has more elements than int64 counts");
    }
    numel *= s;
  }
  std::vector<std::int64_t> strides;
  if (t.strides != nullptr) {
    strides.assign(t.strides, t.strides + t.ndim);
    for (std::int64_t s : strides) {
      if (s < 0) return bad(name, "has a negative stride, which libtorch cannot view");
    }
  } else {
    strides.assign(sizes.size(), 1);
    for (std::int64_t d = t.ndim - 2; d >= 0; --d) strides[d] = strides[d + 1] * sizes[d + 1];
  }
  if (numel > 0 && t.data == nullptr) return bad(name, "has elements but no data");
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  return at::from_blob(data, sizes, strides, at::TensorOptions().dtype(*type).device(device));
}

DLManagedTensorVersioned* to_dlpack(const at::Tensor& tensor,
                                    const std::vector<at::Tensor>& inputs) {
  if (!tensor.defined()) return nullptr;
  at::Tensor t = (tensor.requires_grad() ? tensor.detach() : tensor).contiguous();
  for (const at::Tensor& in : inputs) {
    if (in.defined() && t.storage().is_alias_of(in.storage())) {
      t = t.clone();
      break;
    }
  }
  auto holder = std::make_unique<Holder>();
  holder->managed.dl_tensor.dtype = dl_type(t.scalar_type());
  holder->tensor = t;
  holder->shape.assign(t.sizes().begin(), t.sizes().end());
  holder->strides.assign(t.strides().begin(), t.strides().end());
  DLManagedTensorVersioned& m = holder->managed;
  m.version.major = DLPACK_MAJOR_VERSION;
  m.version.minor = DLPACK_MINOR_VERSION;
  m.manager_ctx = holder.get();
  m.deleter = &delete_holder;
  m.flags = 0;
  m.dl_tensor.data = t.data_ptr();
  m.dl_tensor.device = t.is_cuda() ? DLDevice{kDLCUDA, static_cast<std::int32_t>(t.get_device())}
                                   : DLDevice{kDLCPU, 0};
  m.dl_tensor.ndim = static_cast<std::int32_t>(t.dim());
  m.dl_tensor.shape = holder->shape.data();
  m.dl_tensor.strides = holder->strides.data();
  m.dl_tensor.byte_offset = 0;
  return &holder.release()->managed;
}

}  // namespace keel::c_api
