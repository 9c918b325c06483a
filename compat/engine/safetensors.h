// keel-compat's file format: safetensors (an 8-byte little-endian header
// length, a JSON header, then the tensors' bytes), readable as it is by
// Python's `safetensors`. The reader trusts nothing: every length, offset,
// dtype and shape is checked, and a bad file is `corrupt_data` naming the
// byte offset where it went wrong.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include <ATen/core/Tensor.h>

#include "keel/v1/error.h"

namespace keel::harness {

struct TensorFile {
  // Sorted by name, so a file's bytes depend only on its contents.
  std::map<std::string, at::Tensor> tensors;
  // safetensors' "__metadata__": string to string.
  std::map<std::string, std::string> metadata;
};

// The largest header keel reads (the format allows up to 100 MB; keel's
// own files are far smaller, and a larger claim is read as corruption).
inline constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;

// Serialises `file` (tensors are made contiguous on the CPU first).
result<std::string> encode_safetensors(const TensorFile& file);
// Parses a whole file held in memory.
result<TensorFile> decode_safetensors(std::string_view bytes);

// `io_error` when the path cannot be written or read.
result<void> write_safetensors(const std::string& path, const TensorFile& file);
result<TensorFile> read_safetensors(const std::string& path);

}  // namespace keel::harness
