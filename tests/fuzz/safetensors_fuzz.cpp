// Fuzz target: keel-compat's safetensors reader on arbitrary bytes. A file
// is either rejected as corrupt_data or decoded; a decoded file encodes and
// decodes again to the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "engine/safetensors.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto decoded = keel::harness::decode_safetensors(bytes);
  if (!decoded) {
    if (decoded.error().code() != keel::Errc::corrupt_data) __builtin_trap();
    return 0;
  }
  auto encoded = keel::harness::encode_safetensors(decoded.value());
  if (!encoded) __builtin_trap();
  auto again = keel::harness::decode_safetensors(encoded.value());
  if (!again) __builtin_trap();
  const keel::harness::TensorFile& a = decoded.value();
  const keel::harness::TensorFile& b = again.value();
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) __builtin_trap();
  for (const auto& [name, tensor] : a.tensors) {
    const auto it = b.tensors.find(name);
    if (it == b.tensors.end() || it->second.scalar_type() != tensor.scalar_type() ||
        it->second.sizes() != tensor.sizes()) {
      __builtin_trap();
    }
    // Bitwise: NaN payloads included (compared as bytes).
    if (tensor.numel() > 0 && !at::equal(tensor.contiguous().reshape({-1}).view(at::kByte),
                                         it->second.contiguous().reshape({-1}).view(at::kByte))) {
      __builtin_trap();
    }
  }
  return 0;
}
