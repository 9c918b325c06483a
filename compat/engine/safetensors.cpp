#include "safetensors.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include <ATen/ATen.h>
#include <absl/strings/str_cat.h>
#include <nlohmann/json.hpp>

namespace keel::harness {
namespace {

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
// safetensors' names for the dtypes keel stores.
constexpr DtypeName kDtypes[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},    {at::kBool, "BOOL"},
};

const char* dtype_name(at::ScalarType type) {
  for (const DtypeName& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  return nullptr;
}

bool dtype_from_name(const std::string& name, at::ScalarType* type) {
  for (const DtypeName& d : kDtypes) {
    if (name == d.name) {
      *type = d.type;
      return true;
    }
  }
  return false;
}

Error corrupt(std::uint64_t offset, const std::string& what) {
  return {Errc::corrupt_data, absl::StrCat("safetensors: at byte ", offset, ": ", what)};
}

void put_u64_le(std::string* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_u64_le(std::string_view bytes) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

}  // namespace

result<std::string> encode_safetensors(const TensorFile& file) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<at::Tensor> payload;
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    if (name == "__metadata__" || name.empty()) {
      return Error(Errc::invalid_argument,
                   absl::StrCat("safetensors: tensor name '", name, "' is reserved or empty"));
    }
    if (!tensor.defined()) {
      return Error(Errc::invalid_argument,
                   absl::StrCat("safetensors: tensor '", name, "' is undefined"));
    }
    const char* dtype = dtype_name(tensor.scalar_type());
    if (dtype == nullptr) {
      return Error(
          Errc::invalid_argument,
          absl::StrCat("safetensors: tensor '", name, "' has dtype ",
                       c10::toString(tensor.scalar_type()), ", which keel does not store"));
    }
    at::Tensor bytes = tensor.detach().to(at::kCPU).contiguous();
    const auto size = static_cast<std::uint64_t>(bytes.numel()) * bytes.element_size();
    header[name] = {{"dtype", dtype},
                    {"shape", bytes.sizes().vec()},
                    {"data_offsets", {offset, offset + size}}};
    offset += size;
    payload.push_back(std::move(bytes));
  }
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::string json = header.dump();
  // Python's writer pads the header with spaces to a multiple of 8 bytes, so
  // that the tensors' bytes start aligned; keel does the same.
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + json.size() + offset);
  put_u64_le(&out, json.size());
  out += json;
  for (const at::Tensor& t : payload) {
    out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  }
  return out;
}

result<TensorFile> decode_safetensors(std::string_view bytes) {
  if (bytes.size() < 8) {
    return corrupt(0, absl::StrCat("the file has ", bytes.size(),
                                   " bytes, fewer than the 8 of the header length"));
  }
  const std::uint64_t header_size = get_u64_le(bytes);
  if (header_size > kMaxHeaderBytes || header_size > bytes.size() - 8) {
    return corrupt(0, absl::StrCat("the header claims ", header_size, " bytes but the file has ",
                                   bytes.size() - 8, " after the length (limit ", kMaxHeaderBytes,
                                   "): truncated, or not a safetensors file"));
  }
  const std::string_view header_text = bytes.substr(8, header_size);
  const nlohmann::json header =
      nlohmann::json::parse(header_text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return corrupt(8, "the header is not a JSON object: not a safetensors file");
  }
  const std::string_view data = bytes.substr(8 + header_size);
  const std::uint64_t data_start = 8 + header_size;

  TensorFile file;
  struct Span {
    std::uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return corrupt(8, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return corrupt(8, absl::StrCat("__metadata__ value of '", key, "' is not a string"));
        }
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    // The writer refuses an empty name, so the reader does too: every file
    // keel reads, it can write back.
    if (name.empty()) return corrupt(8, "a tensor has an empty name");
    const std::string where = absl::StrCat("tensor '", name, "': ");
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      return corrupt(8, where + "expected an object with dtype, shape and data_offsets");
    }
    at::ScalarType dtype{};
    if (!entry["dtype"].is_string() ||
        !dtype_from_name(entry["dtype"].get<std::string>(), &dtype)) {
      return corrupt(8, where + "unknown dtype " + entry["dtype"].dump());
    }
    const nlohmann::json& shape_json = entry["shape"];
    if (!shape_json.is_array() || shape_json.size() > 64) {
      return corrupt(8, where + "shape is not an array of at most 64 sizes");
    }
    std::vector<std::int64_t> shape;
    std::uint64_t numel = 1;
    for (const nlohmann::json& s : shape_json) {
      if (!s.is_number_unsigned())
        return corrupt(8, where + "a size is not a non-negative integer");
      const std::uint64_t n = s.get<std::uint64_t>();
      if (n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
          (n != 0 && numel > std::numeric_limits<std::uint64_t>::max() / n)) {
        return corrupt(8, where + "the shape's element count overflows");
      }
      numel *= n;
      shape.push_back(static_cast<std::int64_t>(n));
    }
    const nlohmann::json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return corrupt(8, where + "data_offsets is not [begin, end]");
    }
    const auto begin = offsets[0].get<std::uint64_t>();
    const auto end = offsets[1].get<std::uint64_t>();
    const auto element = static_cast<std::uint64_t>(c10::elementSize(dtype));
    if (end < begin || end > data.size()) {
      return corrupt(data_start + std::min<std::uint64_t>(begin, data.size()),
                     absl::StrCat(where, "data [", begin, ", ", end, ") is outside the ",
                                  data.size(), " data bytes (truncated file?)"));
    }
    if (numel > std::numeric_limits<std::uint64_t>::max() / element ||
        end - begin != numel * element) {
      return corrupt(data_start + begin,
                     absl::StrCat(where, "holds ", end - begin, " bytes, but ",
                                  entry["dtype"].get<std::string>(), " of shape ",
                                  shape_json.dump(), " needs ", numel * element));
    }
    spans.push_back({begin, end, name});
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
    if (end > begin) std::memcpy(t.data_ptr(), data.data() + begin, end - begin);
    file.tensors.emplace(name, std::move(t));
  }
  // As Python's reader demands: the tensors tile the data exactly.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t expected = 0;
  for (const Span& s : spans) {
    if (s.begin != expected) {
      return corrupt(data_start + s.begin,
                     absl::StrCat("tensor '", s.name, "' starts at data byte ", s.begin,
                                  ", expected ", expected, " (tensors overlap or leave a gap)"));
    }
    expected = s.end;
  }
  if (expected != data.size()) {
    return corrupt(data_start + expected,
                   absl::StrCat(data.size() - expected, " bytes after the last tensor"));
  }
  return file;
}

result<void> write_safetensors(const std::string& path, const TensorFile& file) {
  result<std::string> bytes = encode_safetensors(file);
  if (!bytes) return bytes.error();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out.write(bytes.value().data(), static_cast<std::streamsize>(bytes.value().size()));
  if (out) out.close();
  if (!out) {
    return Error(Errc::io_error,
                 absl::StrCat("safetensors: cannot write '", path, "': ", std::strerror(errno)));
  }
  return success();
}

result<TensorFile> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Error(Errc::io_error,
                 absl::StrCat("safetensors: cannot open '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return Error(Errc::io_error, absl::StrCat("safetensors: cannot read '", path, "'"));
  }
  return decode_safetensors(buffer.str());
}

}  // namespace keel::harness
