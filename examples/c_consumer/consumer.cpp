// A service built once for every libtorch release: it sees keel's C ABI and
// DLPack only (the build refuses a torch header on its include path, below),
// links libkeel_loader.so, and runs keel's calls through whichever release's
// plugin it is given. CI builds it once and runs the same file against the
// 2.9.1, 2.13.0 and 2.15.0 plugins (scripts/test.sh).
//
//   keel_c_consumer record  --out FILE  [--plugin PATH | --torch-release R [--plugin-dir D]]
//                           [--torch-library-dir DIR]
//   keel_c_consumer compare --golden FILE [--json REPORT] [same plugin options]
//   keel_c_consumer comm --rank R --world N --rendezvous URL [same plugin options]
//
// comm runs every collective, sync and async, a split, the vocabulary-
// parallel loss and an abort on one rank of N, each checked against values
// computed here (small integers, exact in float64).
//
// record and compare go through the plugin's keel::compat over a C callback
// (KEEL_Compat_Record / KEEL_Compat_Compare): the golden file is keel-compat's
// safetensors, each output judged by keel's tolerance policy (docs/compat.md;
// integers exactly), each case run twice for determinism.
#if __has_include(<ATen/ATen.h>) || __has_include(<torch/torch.h>) || __has_include(<c10/core/Scalar.h>)
#error "the C consumer must build with no libtorch header on its include path"
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// A case's outputs, owned here until handed to keel::compat.
using Outputs = std::map<std::string, Tensor>;

void put(Outputs& outs, const std::string& name, Tensor& t) {
  if (t) outs[name] = std::move(t);
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
  all.emplace_back(
      "attention/packed_step_f32",
      [](const keel::c::Plugin& p, Outputs& o) -> keel::c::Result<int> {
        // A serving step: a decode, a speculative verify of 3, a prefill chunk of 4.
        Inputs in(10);
        Tensor q = in.uniform(kF32, {8, 4, 16});
        Tensor cu = in.ints({0, 1, 4, 8}, {4});
        Tensor kp = in.uniform(kF32, {8, 2, 4, 16}), vp = in.uniform(kF32, {8, 2, 4, 16});
        Tensor table = in.ints({7, 0, 0, 1, 2, 0, 3, 4, 5}, {3, 3});
        Tensor lengths = in.ints({3, 6, 12}, {3});
        keel::c::AttentionSpec spec;
        spec.add(keel::c::mask(KEEL_MASK_CAUSAL, KEEL_ALIGN_BOTTOM_RIGHT));
        CONSUMER_TRY(r, p.attention_packed_paged(q, cu, kp, vp, table, lengths, spec.get(), true));
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
                     auto opt = keel::c::make_args<KEEL_LinearCrossEntropy_Options>();
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
                     auto opt = keel::c::make_args<KEEL_LinearCrossEntropy_Options>();
                     opt.reduction = KEEL_REDUCTION_SUM;
                     CONSUMER_TRY(r, p.loss_forward(h, w, target, &opt));
                     put(o, "loss", r.value().loss);
                     return 0;
                   });
  return all;
}

// ------------------------------------------------------------ keel::compat

// The service's function, as keel::compat calls it through the plugin: the
// case's id names the case (its one input, "seed", is for the record).
struct Service {
  const keel::c::Plugin* plugin;
  std::vector<std::pair<std::string, CaseFn>> cases;
  std::vector<std::string> names;  // the last call's output names
};

std::int32_t run_case(KEEL_Compat_Function_Args* args) {
  auto& service = *static_cast<Service*>(args->user_data);
  args->num_outputs = 0;
  for (const auto& [id, run] : service.cases) {
    if (id != args->case_id) continue;
    Outputs got;
    keel::c::Result<int> r = run(*service.plugin, got);
    if (!r) {
      std::snprintf(args->error, args->error_capacity, "%s", r.error().message().c_str());
      return r.error().code();
    }
    service.names.clear();
    for (auto& [name, t] : got) service.names.push_back(name);
    std::size_t i = 0;
    for (auto& [name, t] : got) {
      if (i == args->output_capacity) break;
      args->outputs[i] = {service.names[i].c_str(), t.release()};
      ++i;
    }
    args->num_outputs = i;
    return KEEL_ERRC_OK;
  }
  std::snprintf(args->error, args->error_capacity, "no case '%s' in this consumer", args->case_id);
  return KEEL_ERRC_UNSUPPORTED;
}

// ------------------------------------------------------------ comm

class Checks {
 public:
  void expect(bool ok, const std::string& what) {
    ++total_;
    if (!ok) {
      ++failed_;
      std::printf("  comm check failed: %s\n", what.c_str());
    }
  }
  template <class T>
  bool ok(const keel::c::Result<T>& r, const std::string& what) {
    expect(static_cast<bool>(r), what + (r ? "" : ": " + r.error().message()));
    return static_cast<bool>(r);
  }
  int total_ = 0, failed_ = 0;
};

int run_comm(const keel::c::Plugin& p, int rank, int world, const std::string& rendezvous) {
  auto o = keel::c::make_args<KEEL_Comm_Create_Args>();
  o.backend = KEEL_COMM_GLOO;
  o.rendezvous = rendezvous.c_str();
  o.rank = rank;
  o.world_size = world;
  o.timeout_ms = 60000;
  keel::c::Result<keel::c::Comm> created = p.create_comm(o);
  if (!created) {
    std::fprintf(stderr, "keel_c_consumer: comm: %s\n", created.error().message().c_str());
    return 1;
  }
  const keel::c::Comm& c = created.value();
  Checks k;
  const auto r = static_cast<double>(rank);
  const auto n = static_cast<double>(world);
  std::vector<double> buf(4 * static_cast<std::size_t>(world));
  const auto view = [&](std::size_t offset, std::int64_t count) {
    return Tensor::view(buf.data() + offset, kF64, {count});
  };
  // all_reduce: sum of rank + 1 over the ranks.
  buf[0] = r + 1;
  Tensor t = view(0, 1);
  k.ok(c.all_reduce(t), "all_reduce");
  k.expect(buf[0] == n * (n + 1) / 2, "all_reduce sum");
  // async all_reduce (max), waited with a bound.
  buf[0] = r;
  keel::c::Result<keel::c::Work> w = c.all_reduce(t, KEEL_REDUCE_MAX, /*async=*/true);
  if (k.ok(w, "all_reduce_async")) {
    keel::c::Result<bool> done = w.value().wait(30000);
    k.expect(done && done.value() && buf[0] == n - 1, "all_reduce_async max after wait");
  }
  // broadcast from the last rank.
  buf[0] = r * 10;
  auto bc = keel::c::make_args<KEEL_Comm_Broadcast_Args>();
  bc.tensor = t.get();
  bc.root = world - 1;
  k.ok(c.run(bc), "broadcast");
  k.expect(buf[0] == (n - 1) * 10, "broadcast value");
  // all_gather: each rank's [r, r] into [2 * N].
  std::vector<double> mine = {r, r};
  Tensor in = Tensor::view(mine.data(), kF64, {2}, /*read_only=*/true);
  Tensor out = view(0, 2 * std::int64_t{world});
  auto ag = keel::c::make_args<KEEL_Comm_AllGather_Args>();
  ag.input = in.get();
  ag.output = out.get();
  k.ok(c.run(ag), "all_gather");
  for (int i = 0; i < 2 * world; ++i) k.expect(buf[i] == std::floor(i / 2.0), "all_gather element");
  // reduce_scatter: [2 * N] of ones, summed, this rank's 2.
  std::vector<double> ones(2 * static_cast<std::size_t>(world), 1.0);
  Tensor ones_t = Tensor::view(ones.data(), kF64, {2 * std::int64_t{world}}, true);
  Tensor part = view(0, 2);
  auto rs = keel::c::make_args<KEEL_Comm_ReduceScatter_Args>();
  rs.input = ones_t.get();
  rs.output = part.get();
  k.ok(c.run(rs), "reduce_scatter");
  k.expect(buf[0] == n && buf[1] == n, "reduce_scatter values");
  // all_to_all, even: element j goes to rank j.
  std::vector<double> send(world);
  for (int j = 0; j < world; ++j) send[j] = r * 100 + j;
  Tensor send_t = Tensor::view(send.data(), kF64, {world}, true);
  Tensor recv_t = view(0, world);
  auto aa = keel::c::make_args<KEEL_Comm_AllToAll_Args>();
  aa.input = send_t.get();
  aa.output = recv_t.get();
  k.ok(c.run(aa), "all_to_all");
  for (int j = 0; j < world; ++j) k.expect(buf[j] == j * 100 + r, "all_to_all element");
  // send / recv around a ring.
  if (world > 1) {
    std::vector<double> token = {r + 0.5};
    Tensor token_t = Tensor::view(token.data(), kF64, {1}, true);
    Tensor got = view(0, 1);
    auto s = keel::c::make_args<KEEL_Comm_Send_Args>();
    s.tensor = token_t.get();
    s.peer = (rank + 1) % world;
    s.tag = 7;
    s.async = 1;
    keel::c::Result<keel::c::Work> sent = c.run(s);
    auto rv = keel::c::make_args<KEEL_Comm_Recv_Args>();
    rv.tensor = got.get();
    rv.peer = (rank + world - 1) % world;
    rv.tag = 7;
    k.ok(c.run(rv), "recv");
    if (k.ok(sent, "send_async")) k.ok(sent.value().wait(30000), "send wait");
    k.expect(buf[0] == (rank + world - 1) % world + 0.5, "recv value");
  }
  // A read-only tensor that a collective would write is refused.
  Tensor frozen = Tensor::view(buf.data(), kF64, {1}, true);
  keel::c::Result<keel::c::Work> refused = c.all_reduce(frozen);
  k.expect(!refused && refused.error().code() == KEEL_ERRC_INVALID_ARGUMENT, "read-only refused");
  // barrier, then a split of every rank, which reduces on its own.
  k.ok(c.run(keel::c::make_args<KEEL_Comm_Barrier_Args>()), "barrier");
  std::vector<std::int32_t> all(world);
  for (int j = 0; j < world; ++j) all[j] = j;
  keel::c::Result<keel::c::Comm> sub = c.split(all, "all");
  if (k.ok(sub, "split")) {
    buf[0] = 2;
    k.ok(sub.value().all_reduce(t, KEEL_REDUCE_PRODUCT), "split all_reduce");
    k.expect(buf[0] == std::pow(2.0, n), "split product");
  }
  // The vocabulary-parallel loss: this rank's rows of the vocabulary, the
  // same loss as the whole vocabulary on one rank (float64, 1e-12).
  {
    Inputs data(42);
    const std::int64_t rows = 6, vocab = 4 * std::int64_t{world}, dim = 8;
    Tensor h = data.uniform(kF64, {rows, dim}), wfull = data.uniform(kF64, {vocab, dim});
    Tensor target = data.ints({0, 5, 3, 1, 2, 4}, {rows});
    const double* wdata = wfull.data<double>() + std::int64_t{rank} * 4 * dim;
    Tensor wmine = Tensor::view(wdata, kF64, {4, dim}, true);
    auto lo = keel::c::make_args<KEEL_LinearCrossEntropy_Options>();
    keel::c::Result<keel::c::LossResult> whole = p.loss_forward(h, wfull, target, &lo);
    lo.communicator = c.get();
    lo.vocab_start = std::int64_t{rank} * 4;
    keel::c::Result<keel::c::LossResult> sharded = p.loss_forward(h, wmine, target, &lo);
    if (k.ok(whole, "loss whole") && k.ok(sharded, "loss vocabulary-parallel")) {
      const double a0 = whole.value().loss.data<double>()[0];
      const double b0 = sharded.value().loss.data<double>()[0];
      k.expect(std::fabs(a0 - b0) <= 1e-12 * std::fabs(a0), "vocabulary-parallel loss");
    }
  }
  // abort: a later collective is an error value, never a hang.
  k.ok(c.abort(), "abort");
  keel::c::Result<KEEL_Comm_Info_Args> info = c.info();
  k.expect(info && info.value().aborted != 0, "aborted");
  keel::c::Result<keel::c::Work> after = c.all_reduce(t);
  k.expect(!after && after.error().code() == KEEL_ERRC_ABORTED, "all_reduce after abort");
  std::printf("keel_c_consumer: comm rank %d of %d: %d of %d checks pass\n", rank, world,
              k.total_ - k.failed_, k.total_);
  return k.failed_ == 0 ? 0 : 1;
}

int usage() {
  std::fprintf(stderr,
               "usage: keel_c_consumer record --out FILE | compare --golden FILE |\n"
               "         comm --rank R --world N --rendezvous URL\n"
               "         [--plugin PATH | --torch-release R [--plugin-dir D]]\n"
               "         [--torch-library-dir DIR]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) return usage();
  const std::string mode = argv[1];
  std::string file, rendezvous, json;
  int rank = -1, world = -1;
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
    } else if (flag == "--torch-library-dir") {
      load.torch_library_dir = value;
    } else if (flag == "--json") {
      json = value;
    } else if (flag == "--rank") {
      rank = std::atoi(value.c_str());
    } else if (flag == "--world") {
      world = std::atoi(value.c_str());
    } else if (flag == "--rendezvous") {
      rendezvous = value;
    } else {
      return usage();
    }
  }
  const bool comm_mode = mode == "comm";
  if (comm_mode ? (rank < 0 || world < 1 || rendezvous.empty())
                : ((mode != "record" && mode != "compare") || file.empty())) {
    return usage();
  }
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
  if (comm_mode) return run_comm(plugin.value(), rank, world, rendezvous);
  Service service{&plugin.value(), cases(), {}};
  const KEEL_Api* api = plugin.value().api();
  keel::c::Error error;
  if (mode == "record") {
    std::vector<std::int64_t> seeds(service.cases.size());
    std::vector<Tensor> seed_tensors;
    std::vector<KEEL_NamedTensor> inputs;
    std::vector<KEEL_Compat_Case> c_cases(service.cases.size());
    std::vector<const KEEL_Compat_Case*> pointers;
    seed_tensors.reserve(seeds.size());
    inputs.reserve(seeds.size());
    for (std::size_t i = 0; i < service.cases.size(); ++i) {
      seeds[i] = static_cast<std::int64_t>(i + 1);
      seed_tensors.push_back(Tensor::view(&seeds[i], kI64, {1}, true));
      inputs.push_back({"seed", seed_tensors.back().get()});
      c_cases[i] = keel::c::make_args<KEEL_Compat_Case>();
      c_cases[i].id = service.cases[i].first.c_str();
      c_cases[i].inputs = &inputs[i];
      c_cases[i].num_inputs = 1;
      pointers.push_back(&c_cases[i]);
    }
    auto a = keel::c::make_args<KEEL_Compat_Record_Args>();
    a.path = file.c_str();
    a.cases = pointers.data();
    a.num_cases = pointers.size();
    a.function = &run_case;
    a.user_data = &service;
    if (keel::c::take_error(api, api->KEEL_Compat_Record(&a), error)) {
      std::fprintf(stderr, "keel_c_consumer: record: %s\n", error.message().c_str());
      return 1;
    }
    std::printf("keel_c_consumer: recorded %zu cases into %s\n", pointers.size(), file.c_str());
    return 0;
  }
  auto a = keel::c::make_args<KEEL_Compat_Compare_Args>();
  a.path = file.c_str();
  a.function = &run_case;
  a.user_data = &service;
  a.json_path = json.empty() ? nullptr : json.c_str();
  if (keel::c::take_error(api, api->KEEL_Compat_Compare(&a), error)) {
    std::fprintf(stderr, "keel_c_consumer: compare: %s\n", error.message().c_str());
    return 1;
  }
  std::printf(
      "keel_c_consumer: %d of %d cases pass against %s (%d failed, %d skipped, %d errors)\n",
      a.passed, a.passed + a.failed + a.skipped + a.errors, file.c_str(), a.failed, a.skipped,
      a.errors);
  return a.failed == 0 && a.errors == 0 && a.skipped == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "keel_c_consumer: %s\n", e.what());
  return 1;
}
