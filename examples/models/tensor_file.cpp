#include "tensor_file.h"

#include <cstdio>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>

namespace models {
namespace {

keel::Error bad(const std::string& path, const std::string& what) {
  return {keel::Errc::corrupt_data, path + ": " + what};
}

}  // namespace

keel::result<std::map<std::string, at::Tensor>> read_tensor_file(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return keel::Error(keel::Errc::io_error, "cannot open " + path);
  if (std::fseek(f.get(), 0, SEEK_END) != 0) return bad(path, "cannot seek");
  const long size = std::ftell(f.get());
  std::uint64_t header_len = 0;
  std::rewind(f.get());
  if (size < 8 || std::fread(&header_len, 8, 1, f.get()) != 1)
    return bad(path, "shorter than 8 bytes");
  const auto file_size = static_cast<std::uint64_t>(size);
  if (header_len > (100ull << 20) || header_len > file_size - 8) {
    return bad(path, "header length " + std::to_string(header_len) + " exceeds the file");
  }
  std::string header(header_len, '\0');
  if (std::fread(header.data(), 1, header_len, f.get()) != header_len)
    return bad(path, "truncated header");
  const nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad(path, "header is not a JSON object");
  const std::uint64_t data_start = 8 + header_len, data_size = file_size - data_start;
  std::map<std::string, at::Tensor> out;
  const std::map<std::string, std::pair<at::ScalarType, std::uint64_t>> dtypes = {
      {"F32", {at::kFloat, 4}}, {"BF16", {at::kBFloat16, 2}}, {"I64", {at::kLong, 8}}};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& e = it.value();
    const auto dtype = e.is_object() ? dtypes.find(e.value("dtype", "")) : dtypes.end();
    if (dtype == dtypes.end() || !e.contains("shape") || !e["shape"].is_array() ||
        !e.contains("data_offsets") || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return bad(path,
                 "tensor " + it.key() + " is not an F32, BF16 or I64 entry with shape and offsets");
    }
    std::vector<std::int64_t> shape;
    std::uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (1ull << 32)) {
        return bad(path, "tensor " + it.key() + " has a bad shape");
      }
      shape.push_back(d.get<std::int64_t>());
      numel *= d.get<std::uint64_t>();
    }
    const auto& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad(path, "tensor " + it.key() + " has bad offsets");
    }
    const auto begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    if (begin > end || end > data_size || end - begin != numel * dtype->second.second) {
      return bad(path, "tensor " + it.key() + "'s bytes [" + std::to_string(begin) + ", " +
                           std::to_string(end) + ") do not fit its shape or the file (" +
                           std::to_string(data_size) + " data bytes)");
    }
    at::Tensor t = at::empty(shape, dtype->second.first);
    if (std::fseek(f.get(), static_cast<long>(data_start + begin), SEEK_SET) != 0 ||
        std::fread(t.data_ptr(), 1, end - begin, f.get()) != end - begin) {
      return bad(path, "cannot read tensor " + it.key());
    }
    out.emplace(it.key(), std::move(t));
  }
  return out;
}

}  // namespace models
