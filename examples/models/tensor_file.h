// Reading a safetensors file (an 8-byte little-endian header length, a JSON
// header, then the tensors' bytes): the weights scripts/convert-gguf.py
// writes and the references tests/models compares with.
#pragma once

#include <map>
#include <string>

#include <ATen/ATen.h>

#include "keel/v1/error.h"

namespace models {

/// Every tensor of the file (float32, bfloat16 or int64), by name. Every
/// length, shape and offset is checked against the file before it is used:
/// a truncated or corrupt file is `corrupt_data` naming it and what is
/// wrong, an unreadable one `io_error`; never a read out of bounds.
keel::result<std::map<std::string, at::Tensor>> read_tensor_file(const std::string& path);

}  // namespace models
