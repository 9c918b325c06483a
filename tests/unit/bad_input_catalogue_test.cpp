// The bad-input catalogue: invalid calls across keel's interfaces and
// keel-compat's reader, one row each. Every row must come back as a
// keel::Error with the expected code and a message naming the argument; none
// may abort, hang or throw.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "engine/safetensors.h"
#include "keel/keel.h"
#include "suite/record_compare.h"

namespace {

using keel::Errc;
using keel::Error;

struct Row {
  std::string name;
  Errc code;
  std::string names;  // a substring the message must contain
  std::function<std::optional<Error>()> call;
};

template <class R>
std::optional<Error> error_of(const R& r) {
  if (r) return std::nullopt;
  return r.error();
}

at::Tensor q() {
  return at::randn({1, 2, 8, 4});
}
at::Tensor kv() {
  return at::randn({1, 2, 8, 4});
}

std::optional<Error> attend(const at::Tensor& qq, const at::Tensor& kk, const at::Tensor& vv,
                            const keel::AttentionSpec& spec = {}) {
  return error_of(keel::attention(qq, kk, vv, spec));
}

keel::AttentionSpec with(keel::Mask m) {
  keel::AttentionSpec s;
  s.masks = {std::move(m)};
  return s;
}

std::optional<Error> lce(const at::Tensor& h, const at::Tensor& w, const at::Tensor& y,
                         const keel::LinearCrossEntropyOptions& o = {}) {
  return error_of(keel::linear_cross_entropy(h, w, y, o));
}

at::Tensor h() {
  return at::randn({4, 8});
}
at::Tensor w() {
  return at::randn({10, 8});
}
at::Tensor y() {
  return at::tensor({1, 2, 3, 4}, at::kLong);
}

keel::LinearCrossEntropyOptions lopt(std::function<void(keel::LinearCrossEntropyOptions&)> f) {
  keel::LinearCrossEntropyOptions o;
  f(o);
  return o;
}

std::string temp_path(const std::string& stem) {
  return (std::filesystem::temp_directory_path() /
          ("keel-catalogue-" + std::to_string(::getpid()) + "-" + stem))
      .string();
}

std::optional<Error> comm_create(std::function<void(keel::comm::CommOptions&)> f) {
  keel::comm::CommOptions o;
  o.rendezvous = "file://" + temp_path("store");
  o.rank = 0;
  o.world_size = 1;
  f(o);
  return error_of(keel::comm::Communicator::create(o));
}

// One shared world of one rank for the per-call rows.
keel::comm::Communicator& world() {
  static keel::comm::Communicator* comm = [] {
    keel::comm::CommOptions o;
    o.rendezvous = "file://" + temp_path("world");
    o.rank = 0;
    o.world_size = 1;
    return new keel::comm::Communicator(keel::comm::Communicator::create(o).value());
  }();
  return *comm;
}

std::vector<Row> catalogue() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<Row> rows = {
      // --- attention -------------------------------------------------------
      {"attention: q of rank 3", Errc::invalid_argument, "q",
       [] {
         return attend(at::randn({2, 8, 4}), kv(), kv());
       }},
      {"attention: k of rank 5", Errc::invalid_argument, "k",
       [] {
         return attend(q(), at::randn({1, 1, 2, 8, 4}), kv());
       }},
      {"attention: undefined v", Errc::invalid_argument, "v",
       [] { return attend(q(), kv(), at::Tensor()); }},
      {"attention: batch mismatch", Errc::invalid_argument, "batch",
       [] {
         return attend(q(), at::randn({2, 2, 8, 4}), at::randn({2, 2, 8, 4}));
       }},
      {"attention: head dim mismatch", Errc::invalid_argument, "k",
       [] {
         return attend(q(), at::randn({1, 2, 8, 5}), kv());
       }},
      {"attention: Hq not a multiple of Hkv", Errc::invalid_argument, "Hq",
       [] {
         return attend(at::randn({1, 3, 8, 4}), kv(), kv());
       }},
      {"attention: k and v lengths differ", Errc::invalid_argument, "v",
       [] {
         return attend(q(), kv(), at::randn({1, 2, 7, 4}));
       }},
      {"attention: dtype mismatch", Errc::invalid_argument, "dtype",
       [] { return attend(q(), kv().to(at::kDouble), kv()); }},
      {"attention: integer q", Errc::invalid_argument, "q",
       [] {
         return attend(at::ones({1, 2, 8, 4}, at::kLong), kv(), kv());
       }},
      {"attention: negative window", Errc::invalid_argument, "window",
       [] { return attend(q(), kv(), kv(), with(keel::Mask::sliding_window(-1, 0))); }},
      {"attention: zero chunk", Errc::invalid_argument, "chunk",
       [] { return attend(q(), kv(), kv(), with(keel::Mask::chunked_causal(0))); }},
      {"attention: document ids of wrong length", Errc::invalid_argument, "document",
       [] {
         return attend(
             q(), kv(), kv(),
             with(keel::Mask::document(at::zeros({7}, at::kLong), at::zeros({8}, at::kLong))));
       }},
      {"attention: float document ids", Errc::invalid_argument, "document",
       [] {
         return attend(q(), kv(), kv(), with(keel::Mask::document(at::zeros({8}), at::zeros({8}))));
       }},
      {"attention: prefix lengths of wrong batch", Errc::invalid_argument, "prefix",
       [] {
         return attend(q(), kv(), kv(), with(keel::Mask::prefix_lm(at::zeros({3}, at::kLong))));
       }},
      {"attention: key padding lengths of wrong batch", Errc::invalid_argument, "kv_lengths",
       [] {
         return attend(q(), kv(), kv(), with(keel::Mask::key_padding(at::zeros({2}, at::kLong))));
       }},
      {"attention: boolean mask of wrong shape", Errc::invalid_argument, "mask",
       [] {
         return attend(q(), kv(), kv(), with(keel::Mask::from_tensor(at::ones({8, 9}, at::kBool))));
       }},
      {"attention: integer mask tensor", Errc::invalid_argument, "mask",
       [] {
         return attend(q(), kv(), kv(), with(keel::Mask::from_tensor(at::ones({8, 8}, at::kInt))));
       }},
      {"attention: block counts above KVb", Errc::invalid_argument, "kv_num_blocks",
       [] {
         keel::BlockMask b;
         b.kv_num_blocks = at::full({1, 2, 1}, 5, at::kInt);
         b.kv_indices = at::zeros({1, 2, 1, 1}, at::kInt);
         return attend(q(), kv(), kv(), with(keel::Mask::block_mask(b)));
       }},
      {"attention: block index out of range", Errc::invalid_argument, "kv_indices",
       [] {
         keel::BlockMask b;
         b.kv_num_blocks = at::ones({1, 2, 1}, at::kInt);
         b.kv_indices = at::full({1, 2, 1, 1}, 3, at::kInt);
         return attend(q(), kv(), kv(), with(keel::Mask::block_mask(b)));
       }},
      {"attention: NaN scale", Errc::invalid_argument, "scale",
       [nan] {
         keel::AttentionSpec s;
         s.scale = nan;
         return attend(q(), kv(), kv(), s);
       }},
      {"attention: infinite softcap", Errc::invalid_argument, "softcap",
       [inf] {
         keel::AttentionSpec s;
         s.softcap = inf;
         return attend(q(), kv(), kv(), s);
       }},
      {"attention: ALiBi slopes of wrong length", Errc::invalid_argument, "alibi",
       [] {
         keel::AttentionSpec s;
         s.alibi_slopes = at::ones({3});
         return attend(q(), kv(), kv(), s);
       }},
      {"attention: bias not broadcastable", Errc::invalid_argument, "bias",
       [] {
         keel::AttentionSpec s;
         s.bias = at::zeros({3, 8});
         return attend(q(), kv(), kv(), s);
       }},
      {"attention: unknown backend", Errc::invalid_argument, "backend",
       [] {
         keel::AttentionSpec s;
         s.dispatch.backend = static_cast<keel::Backend>(42);
         return attend(q(), kv(), kv(), s);
       }},
      // --- fused loss ------------------------------------------------------
      {"loss: D of hidden differs from weight", Errc::invalid_argument, "weight",
       [] {
         return lce(h(), at::randn({10, 7}), y());
       }},
      {"loss: target shape", Errc::invalid_argument, "target",
       [] { return lce(h(), w(), at::zeros({3}, at::kLong)); }},
      {"loss: float target", Errc::invalid_argument, "target",
       [] { return lce(h(), w(), at::zeros({4})); }},
      {"loss: target outside [0, V)", Errc::invalid_argument, "target",
       [] {
         return lce(h(), w(), at::tensor({1, 2, 10, 4}, at::kLong));
       }},
      {"loss: negative target other than ignore_index", Errc::invalid_argument, "target",
       [] {
         return lce(h(), w(), at::tensor({1, -5, 3, 4}, at::kLong));
       }},
      {"loss: dtype mismatch", Errc::invalid_argument, "dtype",
       [] { return lce(h(), w().to(at::kDouble), y()); }},
      {"loss: hidden of rank 1", Errc::invalid_argument, "hidden",
       [] { return lce(at::randn({8}), w(), y()); }},
      {"loss: weight of rank 3", Errc::invalid_argument, "weight",
       [] {
         return lce(h(), at::randn({10, 8, 1}), y());
       }},
      {"loss: smoothing above 1", Errc::invalid_argument, "label_smoothing",
       [] { return lce(h(), w(), y(), lopt([](auto& o) { o.label_smoothing = 1.5; })); }},
      {"loss: NaN smoothing", Errc::invalid_argument, "label_smoothing",
       [nan] { return lce(h(), w(), y(), lopt([nan](auto& o) { o.label_smoothing = nan; })); }},
      {"loss: class weights of wrong length", Errc::invalid_argument, "class_weights",
       [] { return lce(h(), w(), y(), lopt([](auto& o) { o.class_weights = at::ones({9}); })); }},
      {"loss: negative chunk size", Errc::invalid_argument, "chunk_size",
       [] { return lce(h(), w(), y(), lopt([](auto& o) { o.chunk_size = -3; })); }},
      {"loss: bias of wrong shape", Errc::invalid_argument, "bias",
       [] { return lce(h(), w(), y(), lopt([](auto& o) { o.bias = at::zeros({11}); })); }},
      {"loss: NaN z-loss", Errc::invalid_argument, "z_loss",
       [nan] { return lce(h(), w(), y(), lopt([nan](auto& o) { o.z_loss = nan; })); }},
      {"loss: negative softcap", Errc::invalid_argument, "softcap",
       [] { return lce(h(), w(), y(), lopt([](auto& o) { o.logit_softcap = -1.0; })); }},
      {"loss: unknown reduction", Errc::invalid_argument, "reduction",
       [] {
         return lce(h(), w(), y(),
                    lopt([](auto& o) { o.reduction = static_cast<keel::Reduction>(7); }));
       }},
      {"loss: undefined hidden", Errc::invalid_argument, "hidden",
       [] { return lce(at::Tensor(), w(), y()); }},
      {"loss: negative vocab_start", Errc::invalid_argument, "vocab_parallel.vocab_start",
       [] { return lce(h(), w(), y(), lopt([](auto& o) { o.vocab_parallel.vocab_start = -4; })); }},
      {"loss: vocab_start without a communicator", Errc::invalid_argument,
       "vocab_parallel.communicator is unset",
       [] { return lce(h(), w(), y(), lopt([](auto& o) { o.vocab_parallel.vocab_start = 10; })); }},
      // --- logsumexp -------------------------------------------------------
      {"logsumexp: undefined input", Errc::invalid_argument, "input",
       [] { return error_of(keel::logsumexp(at::Tensor())); }},
      {"logsumexp: dim out of range", Errc::invalid_argument, "dim",
       [] {
         keel::LogsumexpOptions o;
         o.dim = 5;
         return error_of(keel::logsumexp(at::randn({2, 3}), o));
       }},
      {"logsumexp: mask of wrong shape", Errc::invalid_argument, "mask",
       [] {
         keel::LogsumexpOptions o;
         o.mask = at::ones({3, 3}, at::kBool);
         return error_of(keel::logsumexp(at::randn({2, 3}), o));
       }},
      {"logsumexp: integer input", Errc::invalid_argument, "input",
       [] {
         return error_of(keel::logsumexp(at::ones({2, 3}, at::kLong)));
       }},
      // --- communicator ----------------------------------------------------
      {"comm: unknown rendezvous scheme", Errc::invalid_argument, "rendezvous",
       [] { return comm_create([](auto& o) { o.rendezvous = "udp://x:1"; }); }},
      {"comm: tcp without port", Errc::invalid_argument, "tcp://host:port",
       [] { return comm_create([](auto& o) { o.rendezvous = "tcp://x"; }); }},
      {"comm: port out of range", Errc::invalid_argument, "port",
       [] { return comm_create([](auto& o) { o.rendezvous = "tcp://x:70000"; }); }},
      {"comm: rank beyond world", Errc::invalid_argument, "rank",
       [] { return comm_create([](auto& o) { o.rank = 3; }); }},
      {"comm: zero world", Errc::invalid_argument, "world size",
       [] { return comm_create([](auto& o) { o.world_size = 0; }); }},
      {"comm: zero timeout", Errc::invalid_argument, "timeout",
       [] { return comm_create([](auto& o) { o.timeout = std::chrono::milliseconds(0); }); }},
      {"comm: peer timeout below two heartbeats", Errc::invalid_argument, "peer_timeout",
       [] { return comm_create([](auto& o) { o.peer_timeout = std::chrono::milliseconds(1); }); }},
      {"comm: name with a slash", Errc::invalid_argument, "name",
       [] { return comm_create([](auto& o) { o.name = "x/y"; }); }},
      {"comm: nccl on a CPU device", Errc::invalid_argument, "device",
       [] { return comm_create([](auto& o) { o.backend = keel::comm::CommBackend::nccl; }); }},
      {"comm: avg of integers", Errc::invalid_argument, "op",
       [] {
         at::Tensor t = at::ones({2}, at::kLong);
         return error_of(world().all_reduce(t, keel::comm::ReduceOp::avg));
       }},
      {"comm: non-contiguous tensor", Errc::invalid_argument, "tensor",
       [] {
         at::Tensor t = at::ones({3, 3}).t();
         return error_of(world().all_reduce(t));
       }},
      {"comm: all_gather output of wrong shape", Errc::invalid_argument, "output",
       [] {
         at::Tensor out = at::empty({3});
         return error_of(world().all_gather(out, at::ones({2})));
       }},
      {"comm: all_gather list of wrong length", Errc::invalid_argument, "outputs",
       [] {
         std::vector<at::Tensor> outs{at::empty({2}), at::empty({2})};
         return error_of(world().all_gather(outs, at::ones({2})));
       }},
      {"comm: reduce_scatter input of wrong shape", Errc::invalid_argument, "input",
       [] {
         at::Tensor out = at::empty({2});
         return error_of(world().reduce_scatter(out, at::ones({3})));
       }},
      {"comm: broadcast root out of range", Errc::invalid_argument, "root",
       [] {
         at::Tensor t = at::ones({2});
         return error_of(world().broadcast(t, 4));
       }},
      {"comm: all_to_all splits of wrong count", Errc::invalid_argument, "input_splits",
       [] {
         at::Tensor out = at::empty({2});
         return error_of(world().all_to_all(out, at::ones({2}), {2}, {1, 1}));
       }},
      {"comm: send to self", Errc::invalid_argument, "peer",
       [] { return error_of(world().send(at::ones({2}), 0)); }},
      {"comm: all_to_all trailing dims differ", Errc::invalid_argument, "trailing dims",
       [] {
         at::Tensor out = at::empty({2, 3});
         return error_of(world().all_to_all(out, at::ones({2, 4}), {2}, {2}));
       }},
      {"comm: split with a duplicate rank", Errc::invalid_argument, "ranks",
       [] {
         return error_of(world().split({0, 0}, "dup"));
       }},
      {"comm: wait on an empty Work", Errc::invalid_argument, "Work",
       [] { return error_of(keel::comm::Work().wait()); }},
      // --- keel-compat's reader and writer ---------------------------------
      {"compat: truncated file", Errc::corrupt_data, "at byte",
       [] { return error_of(keel::harness::decode_safetensors(std::string("\x10\x00\x00", 3))); }},
      {"compat: header longer than the file", Errc::corrupt_data, "at byte",
       [] {
         return error_of(keel::harness::decode_safetensors(
             std::string("\xff\x00\x00\x00\x00\x00\x00\x00{}", 10)));
       }},
      {"compat: header that is not JSON", Errc::corrupt_data, "at byte",
       [] {
         return error_of(
             keel::harness::decode_safetensors(std::string("\x04\0\0\0\0\0\0\0nope", 12)));
       }},
      {"compat: missing file", Errc::io_error, "/nonexistent",
       [] { return error_of(keel::harness::read_safetensors("/nonexistent/golden.safetensors")); }},
      {"compat: unwritable output", Errc::io_error, "/nonexistent-dir",
       [] {
         keel::harness::TensorFile f;
         return error_of(keel::harness::write_safetensors("/nonexistent-dir/x.safetensors", f));
       }},
      {"compat: record into an unwritable path", Errc::io_error, "/nonexistent-dir",
       [] {
         keel::harness::RecordOptions o;
         o.out = "/nonexistent-dir/golden.safetensors";
         o.filter = "float64/rows";
         return error_of(keel::harness::record(o));
       }},
  };
  return rows;
}

TEST(BadInputCatalogue, EveryInvalidCallIsANamedErrorNeverACrash) {
  const auto rows = catalogue();
  ASSERT_FALSE(rows.empty());
  for (const Row& row : rows) {
    std::optional<Error> e;
    try {
      e = row.call();
    } catch (const std::exception& ex) {
      ADD_FAILURE() << row.name << ": threw " << ex.what();
      continue;
    }
    if (!e) {
      ADD_FAILURE() << row.name << ": succeeded";
      continue;
    }
    EXPECT_EQ(e->code(), row.code) << row.name << ": " << e->to_string();
    EXPECT_NE(e->message().find(row.names), std::string::npos)
        << row.name << ": the message does not name \"" << row.names << "\": " << e->to_string();
  }
}

}  // namespace
