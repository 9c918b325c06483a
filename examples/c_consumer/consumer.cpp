// A service built once for every libtorch release: it sees keel's C ABI and
// DLPack only (the build refuses a torch header on its include path, below),
// links libkeel_loader.so, and runs keel's calls through whichever release's
// plugin it is given. CI builds it once and runs the same file against the
// 2.9.1, 2.13.0 and 2.15.0 plugins (scripts/test.sh).
//
//   keel_c_consumer record  --out FILE  [--plugin PATH | --torch-release R [--plugin-dir D]]
//   keel_c_consumer compare --golden FILE [same plugin options]
//
// record writes every output of its cases; compare runs them again and
// judges each output against the file under keel's tolerance policy
// (docs/compat.md): float64 1e-10, float32 1e-5, bfloat16 1e-2 / 1.6e-2
// (atol / rtol), integers exactly.
#if __has_include(<ATen/ATen.h>) || __has_include(<torch/torch.h>) || __has_include(<c10/core/Scalar.h>)
#error "the C consumer must build with no libtorch header on its include path"
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "keel/c/keel.hpp"

namespace {

using keel::c::Tensor;

constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kF64{kDLFloat, 64, 1};
constexpr DLDataType kBF16{kDLBfloat, 16, 1};
constexpr DLDataType kI64{kDLInt, 64, 1};
constexpr DLDataType kBool{kDLBool, 8, 1};

// Inputs: seeded, the same bytes on every run and machine (splitmix64).
class Inputs {
 public:
  explicit Inputs(std::uint64_t seed) : state_(seed) {}
  // Uniform in [-1, 1) as float32, float64 or bfloat16 (rounded to nearest even).
  Tensor uniform(DLDataType dtype, std::vector<std::int64_t> shape) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    std::vector<char>& buf = keep(n * (dtype.bits / 8));
    for (std::int64_t i = 0; i < n; ++i) {
      const double x = static_cast<double>(next() >> 11) * 0x1.0p-53 * 2 - 1;
      if (dtype.code == kDLFloat && dtype.bits == 64) {
        std::memcpy(buf.data() + i * 8, &x, 8);
      } else {
        const auto f = static_cast<float>(x);
        if (dtype.bits == 32) {
          std::memcpy(buf.data() + i * 4, &f, 4);
        } else {
          std::uint32_t u;
          std::memcpy(&u, &f, 4);
          const auto h = static_cast<std::uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
          std::memcpy(buf.data() + i * 2, &h, 2);
        }
      }
    }
    return Tensor::view(buf.data(), dtype, std::move(shape), /*read_only=*/true);
  }
  Tensor ints(std::vector<std::int64_t> values, std::vector<std::int64_t> shape) {
    std::vector<char>& buf = keep(values.size() * 8);
    std::memcpy(buf.data(), values.data(), buf.size());
    return Tensor::view(buf.data(), kI64, std::move(shape), true);
  }
  Tensor bools(std::vector<std::uint8_t> values, std::vector<std::int64_t> shape) {
    std::vector<char>& buf = keep(values.size());
    std::memcpy(buf.data(), values.data(), buf.size());
    return Tensor::view(buf.data(), kBool, std::move(shape), true);
  }

 private:
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::vector<char>& keep(std::size_t bytes) {
    buffers_.emplace_back(bytes);
    return buffers_.back();
  }
  std::uint64_t state_;
  std::vector<std::vector<char>> buffers_;
};

// A recorded output: dtype, shape and bytes.
struct Output {
  DLDataType dtype{};
  std::vector<std::int64_t> shape;
  std::vector<char> bytes;
};
using Outputs = std::map<std::string, Output>;

void put(Outputs& outs, const std::string& name, const Tensor& t) {
  if (!t) return;
  Output o;
  o.dtype = t.dtype();
  o.shape = t.shape();
  const auto n = static_cast<std::size_t>(t.numel()) * (t.dtype().bits / 8);
  o.bytes.assign(t.data<char>(), t.data<char>() + n);
  outs[name] = std::move(o);
}

using CaseFn = std::function<keel::c::Result<int>(const keel::c::Plugin&, Outputs&)>;

// `var` names a declaration, which parentheses would break.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define CONSUMER_TRY(var, expr) \
  auto var = (expr);            \
  if (!var) return var.error()
// NOLINTEND(bugprone-macro-parentheses)

// keel-compat's canonical shapes, through the C face.
std::vector<std::pair<std::string, CaseFn>> cases() {
  std::vector<std::pair<std::string, CaseFn>> all;
  all.emplace_back("attention/gqa8_2_causal_bottom_right_f32",
                   [](const keel::c::Plugin& p, Outputs& o) -> keel::c::Result<int> {
                     Inputs in(1);
                     Tensor q = in.uniform(kF32, {2, 8, 5, 16}),
                            k = in.uniform(kF32, {2, 2, 9, 16}),
                            v = in.uniform(kF32, {2, 2, 9, 16});
                     keel::c::AttentionSpec spec;
                     spec.add(keel::c::mask(KEEL_MASK_CAUSAL, KEEL_ALIGN_BOTTOM_RIGHT));
                     CONSUMER_TRY(r, p.attention(q, k, v, spec.get(), true));
                     put(o, "out", r.value().out);
                     put(o, "lse", r.value().lse);
                     return 0;
                   });
  all.emplace_back("attention/window_softcap_alibi_f64",
                   [](const keel::c::Plugin& p, Outputs& o) -> keel::c::Result<int> {
                     Inputs in(2);
                     Tensor q = in.uniform(kF64, {1, 4, 12, 8}),
                            k = in.uniform(kF64, {1, 4, 12, 8}),
                            v = in.uniform(kF64, {1, 4, 12, 8}), slopes = in.uniform(kF32, {4});
                     keel::c::AttentionSpec spec;
                     KEEL_Mask window = keel::c::mask(KEEL_MASK_SLIDING_WINDOW);
                     window.window_left = 3;
                     window.window_right = 1;
                     spec.add(window);
                     spec.fields().softcap = 5;
                     spec.fields().alibi_slopes = slopes.get();
                     CONSUMER_TRY(r, p.attention(q, k, v, spec.get(), true));
                     put(o, "out", r.value().out);
                     put(o, "lse", r.value().lse);
                     return 0;
                   });
  all.emplace_back("attention/documents_and_padding_f32",
                   [](const keel::c::Plugin& p, Outputs& o) -> keel::c::Result<int> {
                     Inputs in(3);
                     Tensor q = in.uniform(kF32, {2, 2, 6, 8}), k = in.uniform(kF32, {2, 2, 6, 8}),
                            v = in.uniform(kF32, {2, 2, 6, 8});
                     Tensor ids = in.ints({0, 0, 1, 1, 1, 2, 0, 1, 1, 2, 2, 2}, {2, 6});
                     Tensor lengths = in.ints({5, 0}, {2});
                     keel::c::AttentionSpec spec;
                     KEEL_Mask doc = keel::c::mask(KEEL_MASK_DOCUMENT);
                     doc.q_document_ids = ids.get();
                     doc.kv_document_ids = ids.get();
                     KEEL_Mask pad = keel::c::mask(KEEL_MASK_KEY_PADDING);
                     pad.kv_lengths = lengths.get();
                     spec.add(doc).add(pad);
                     CONSUMER_TRY(r, p.attention(q, k, v, spec.get(), true));
                     put(o, "out", r.value().out);
                     put(o, "lse", r.value().lse);
                     return 0;
                   });
  // [c_face_attention]
  all.emplace_back(
      "attention/gqa32_8_decode_bf16",
      [](const keel::c::Plugin& p, Outputs& o) -> keel::c::Result<int> {
        Inputs in(4);
        Tensor q = in.uniform(kBF16, {1, 32, 1, 128});  // views of the service's own buffers
        Tensor k = in.uniform(kBF16, {1, 8, 64, 128});
        Tensor v = in.uniform(kBF16, {1, 8, 64, 128});
        keel::c::AttentionSpec spec;
        spec.add(keel::c::mask(KEEL_MASK_CAUSAL, KEEL_ALIGN_BOTTOM_RIGHT));
        keel::c::Result<keel::c::AttentionResult> r =
            p.attention(q, k, v, spec.get(), /*return_lse=*/true);
        if (!r) return r.error();  // a KEEL_Errc and a message naming the argument
        put(o, "out", r.value().out);
        put(o, "lse", r.value().lse);
        return 0;
      });
  // [c_face_attention]
  all.emplace_back("attention/backward_causal_bias_f64",
                   [](const keel::c::Plugin& p, Outputs& o) -> keel::c::Result<int> {
                     Inputs in(5);
                     Tensor q = in.uniform(kF64, {1, 2, 7, 8}), k = in.uniform(kF64, {1, 2, 7, 8}),
                            v = in.uniform(kF64, {1, 2, 7, 8}),
                            bias = in.uniform(kF64, {1, 2, 7, 7}),
                            dout = in.uniform(kF64, {1, 2, 7, 8});
                     keel::c::AttentionSpec spec;
                     spec.add(keel::c::mask(KEEL_MASK_CAUSAL));
                     spec.fields().bias = bias.get();
                     CONSUMER_TRY(g, p.attention_backward(q, k, v, spec.get(), dout));
                     put(o, "dq", g.value().dq);
                     put(o, "dk", g.value().dk);
                     put(o, "dv", g.value().dv);
                     put(o, "dbias", g.value().dbias);
                     return 0;
                   });
  all.emplace_back(
      "attention/paged_shuffled_f32",
      [](const keel::c::Plugin& p, Outputs& o) -> keel::c::Result<int> {
        Inputs in(6);
        Tensor q = in.uniform(kF32, {2, 4, 2, 16});
        Tensor kp = in.uniform(kF32, {6, 2, 4, 16}), vp = in.uniform(kF32, {6, 2, 4, 16});
        Tensor table = in.ints({4, 1, 0, 5, 2, 3}, {2, 3});
        Tensor lengths = in.ints({7, 10}, {2});
        keel::c::AttentionSpec spec;
        spec.add(keel::c::mask(KEEL_MASK_CAUSAL, KEEL_ALIGN_BOTTOM_RIGHT));
        CONSUMER_TRY(r, p.attention_paged(q, kp, vp, table, lengths, spec.get(), true));
        put(o, "out", r.value().out);
        put(o, "lse", r.value().lse);
        return 0;
      });
  all.emplace_back("logsumexp/masked_f32",
                   [](const keel::c::Plugin& p, Outputs& o) -> keel::c::Result<int> {
                     Inputs in(7);
                     Tensor x = in.uniform(kF32, {3, 5});
                     Tensor mask = in.bools({1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1}, {3, 5});
                     CONSUMER_TRY(r, p.logsumexp(x, -1, false, mask));
                     put(o, "value", r.value());
                     return 0;
                   });
  all.emplace_back("loss/smoothing_bias_ignore_f32",
                   [](const keel::c::Plugin& p, Outputs& o) -> keel::c::Result<int> {
                     Inputs in(8);
                     Tensor h = in.uniform(kF32, {6, 16}), w = in.uniform(kF32, {40, 16}),
                            b = in.uniform(kF32, {40});
                     Tensor target = in.ints({3, -100, 39, 0, 7, -100}, {6});
                     KEEL_LinearCrossEntropy_Options opt;
                     std::memset(&opt, 0, sizeof opt);
                     opt.struct_size = sizeof opt;
                     opt.ignore_index = -100;
                     opt.label_smoothing = 0.1;
                     opt.bias = b.get();
                     opt.return_per_token_loss = 1;
                     opt.return_lse = 1;
                     CONSUMER_TRY(r, p.loss_forward_backward(h, w, target, &opt));
                     put(o, "loss", r.value().loss);
                     put(o, "per_token_loss", r.value().per_token_loss);
                     put(o, "lse", r.value().lse);
                     put(o, "dhidden", r.value().dhidden);
                     put(o, "dweight", r.value().dweight);
                     put(o, "dbias", r.value().dbias);
                     return 0;
                   });
  all.emplace_back("loss/sum_f64",
                   [](const keel::c::Plugin& p, Outputs& o) -> keel::c::Result<int> {
                     Inputs in(9);
                     Tensor h = in.uniform(kF64, {5, 8}), w = in.uniform(kF64, {11, 8});
                     Tensor target = in.ints({1, 2, 3, 4, 10}, {5});
                     KEEL_LinearCrossEntropy_Options opt;
                     std::memset(&opt, 0, sizeof opt);
                     opt.struct_size = sizeof opt;
                     opt.reduction = KEEL_REDUCTION_SUM;
                     opt.ignore_index = -100;
                     CONSUMER_TRY(r, p.loss_forward(h, w, target, &opt));
                     put(o, "loss", r.value().loss);
                     return 0;
                   });
  return all;
}

// ------------------------------------------------------------ the file

bool write_file(const std::string& path, const std::map<std::string, Outputs>& all) {
  std::ofstream f(path, std::ios::binary);
  const auto u64 = [&](std::uint64_t x) { f.write(reinterpret_cast<const char*>(&x), 8); };
  f.write("KEELCON1", 8);
  u64(all.size());
  for (const auto& [id, outs] : all) {
    u64(id.size());
    f.write(id.data(), static_cast<std::streamsize>(id.size()));
    u64(outs.size());
    for (const auto& [name, o] : outs) {
      u64(name.size());
      f.write(name.data(), static_cast<std::streamsize>(name.size()));
      u64(o.dtype.code);
      u64(o.dtype.bits);
      u64(o.shape.size());
      for (auto s : o.shape) u64(static_cast<std::uint64_t>(s));
      u64(o.bytes.size());
      f.write(o.bytes.data(), static_cast<std::streamsize>(o.bytes.size()));
    }
  }
  return static_cast<bool>(f);
}

bool read_file(const std::string& path, std::map<std::string, Outputs>& all) {
  std::ifstream f(path, std::ios::binary);
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "KEELCON1", 8) != 0) return false;
  bool ok = true;
  const auto u64 = [&]() {
    std::uint64_t x = 0;
    ok = ok && static_cast<bool>(f.read(reinterpret_cast<char*>(&x), 8));
    return x;
  };
  const auto str = [&]() {
    const std::uint64_t n = u64();
    if (!ok || n > (1u << 20)) return ok = false, std::string();
    std::string s(n, '\0');
    ok = ok && static_cast<bool>(f.read(s.data(), static_cast<std::streamsize>(n)));
    return s;
  };
  const std::uint64_t n_cases = u64();
  for (std::uint64_t c = 0; ok && c < n_cases && c < 4096; ++c) {
    const std::string id = str();
    const std::uint64_t n_outs = u64();
    for (std::uint64_t i = 0; ok && i < n_outs && i < 64; ++i) {
      const std::string name = str();
      Output o;
      o.dtype.code = static_cast<std::uint8_t>(u64());
      o.dtype.bits = static_cast<std::uint8_t>(u64());
      o.dtype.lanes = 1;
      const std::uint64_t nd = u64();
      for (std::uint64_t d = 0; ok && d < nd && d < 16; ++d)
        o.shape.push_back(static_cast<std::int64_t>(u64()));
      const std::uint64_t bytes = u64();
      if (!ok || bytes > (std::uint64_t{1} << 32)) return false;
      o.bytes.resize(bytes);
      ok = ok && static_cast<bool>(f.read(o.bytes.data(), static_cast<std::streamsize>(bytes)));
      all[id][name] = std::move(o);
    }
  }
  return ok;
}

double value_at(const Output& o, std::size_t i) {
  if (o.dtype.code == kDLFloat && o.dtype.bits == 64) {
    double x;
    std::memcpy(&x, o.bytes.data() + i * 8, 8);
    return x;
  }
  if (o.dtype.code == kDLFloat && o.dtype.bits == 32) {
    float x;
    std::memcpy(&x, o.bytes.data() + i * 4, 4);
    return x;
  }
  std::uint16_t h;
  std::memcpy(&h, o.bytes.data() + i * 2, 2);
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Empty when `got` is within the policy of `want`, else why not.
std::string judge(const Output& want, const Output& got) {
  if (want.dtype.code != got.dtype.code || want.dtype.bits != got.dtype.bits)
    return "dtype changed";
  if (want.shape != got.shape) return "shape changed";
  if (want.dtype.code != kDLFloat && want.dtype.code != kDLBfloat) {
    return want.bytes == got.bytes ? "" : "integer values differ (they must match exactly)";
  }
  const double atol = want.dtype.bits == 64 ? 1e-10 : want.dtype.bits == 32 ? 1e-5 : 1e-2;
  const double rtol = want.dtype.bits == 64 ? 1e-10 : want.dtype.bits == 32 ? 1e-5 : 1.6e-2;
  const std::size_t n = want.bytes.size() / (want.dtype.bits / 8);
  for (std::size_t i = 0; i < n; ++i) {
    const double w = value_at(want, i), g = value_at(got, i);
    if (std::isnan(w) && std::isnan(g)) continue;
    if (std::isinf(w) && w == g) continue;
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      return "element " + std::to_string(i) + ": " + std::to_string(g) + ", recorded " +
             std::to_string(w);
    }
  }
  return "";
}

int usage() {
  std::fprintf(stderr,
               "usage: keel_c_consumer record --out FILE | compare --golden FILE\n"
               "         [--plugin PATH | --torch-release R [--plugin-dir D]]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string mode = argv[1];
  std::string file;
  keel::c::LoadOptions load;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--out" || flag == "--golden") {
      file = value;
    } else if (flag == "--plugin") {
      load.plugin_path = value;
    } else if (flag == "--torch-release") {
      load.torch_release = value;
    } else if (flag == "--plugin-dir") {
      load.plugin_dir = value;
    } else {
      return usage();
    }
  }
  if ((mode != "record" && mode != "compare") || file.empty()) return usage();
  keel::c::Result<keel::c::Plugin> plugin = keel::c::Plugin::load(load);
  if (!plugin) {
    std::fprintf(stderr, "keel_c_consumer: %s\n", plugin.error().message().c_str());
    return 1;
  }
  keel::c::Result<keel::c::PluginInfo> info = plugin.value().info();
  if (!info) {
    std::fprintf(stderr, "keel_c_consumer: %s\n", info.error().message().c_str());
    return 1;
  }
  std::printf(
      "keel_c_consumer: plugin %s: keel %s, C ABI %u.%u, built on libtorch %s, running %s\n",
      plugin.value().path().c_str(), info.value().keel_version.c_str(), info.value().api_major,
      info.value().api_minor, info.value().torch_release.c_str(),
      info.value().torch_loaded.c_str());
  std::map<std::string, Outputs> got;
  int errors = 0;
  for (const auto& [id, run] : cases()) {
    keel::c::Result<int> r = run(plugin.value(), got[id]);
    if (!r) {
      std::printf("  %-44s error %d: %s\n", id.c_str(), r.error().code(),
                  r.error().message().c_str());
      ++errors;
    }
  }
  if (mode == "record") {
    if (!write_file(file, got)) {
      std::fprintf(stderr, "keel_c_consumer: cannot write %s\n", file.c_str());
      return 1;
    }
    std::printf("keel_c_consumer: recorded %zu cases into %s (%d errors)\n", got.size(),
                file.c_str(), errors);
    return errors == 0 ? 0 : 1;
  }
  std::map<std::string, Outputs> golden;
  if (!read_file(file, golden)) {
    std::fprintf(stderr, "keel_c_consumer: %s is not a consumer recording\n", file.c_str());
    return 1;
  }
  int outputs = 0, failed = 0;
  for (const auto& [id, outs] : golden) {
    for (const auto& [name, want] : outs) {
      ++outputs;
      const auto c = got.find(id);
      const auto g = c == got.end() ? Outputs::const_iterator() : c->second.find(name);
      const std::string why =
          (c == got.end() || g == c->second.end()) ? "missing" : judge(want, g->second);
      if (!why.empty()) {
        ++failed;
        std::printf("  %-44s %-16s %s\n", id.c_str(), name.c_str(), why.c_str());
      }
    }
  }
  std::printf("keel_c_consumer: %d of %d outputs within the policy of %s (%d errors)\n",
              outputs - failed, outputs, file.c_str(), errors);
  return failed == 0 && errors == 0 ? 0 : 1;
}
