// One rank of a vocabulary-parallel loss test: tests/distributed/
// vocab_parallel_test.cpp spawns 2 or 3 of these on loopback. Every rank
// builds the whole problem from the same seed, computes its shard's loss
// with keel, and checks the loss, the per-token loss and lse and every
// gradient against the unsharded float64 reference
// (tests/reference/linear_cross_entropy_reference.h) on the same values.
//
//   keel_vocab_parallel_worker SCENARIO --rank R --world N --port P [--case NAME]
//
// Scenarios: case (one named case of kCases), bad_input, disagree, gap,
// die_in_forward, die_before_backward. Prints "FAIL ..." for each failed
// check and "LOSS <hex>" (the loss's bits, for the cross-rank comparison);
// exit 0 when every check passed, 1 otherwise, 2 on usage.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include "keel/keel.h"
#include "loopback.h"
#include "reference/linear_cross_entropy_reference.h"
#include "support/loss_options.h"

namespace {

using keel::Errc;
using keel::LinearCrossEntropyOptions;
using keel::Reduction;
using keel::comm::Communicator;
using keel::testing::now_ms;
using Millis = std::chrono::milliseconds;

struct Args {
  std::string scenario;
  std::string case_name;
  int rank = 0;
  int world = 2;
  int port = 0;
};

int failures = 0;

void fail(const std::string& what) {
  std::cout << "FAIL " << what << std::endl;
  ++failures;
}

// How the vocabulary is cut: equal shards (the remainder on the last),
// shards of 1 : 2 : 3 ... classes, or those uneven shards held in reverse
// rank order (rank 0 holds the last classes).
enum class Split : std::uint8_t { even, uneven, reversed };

// One row of the loss's option table (tests/support/loss_options.h), and
// how it runs on the ranks.
struct Case : keel::testing::LossOptionRow {
  std::int64_t vocab_chunk;  // 0: whole rows (gradients in forward)
  at::ScalarType dtype;
  Split split;
  bool grad;
};

constexpr std::int64_t kDim = 24;

// clang-format off
const Case kCases[] = {
  // name                     reduction        ign   ign% smth  cw     bias   cap  z     N   V     vb dtype        split            grad
  {{"mean_plain",             Reduction::mean, -100, 0.0, 0.0,  false, false, 0,   0,    40, 61},  0, at::kDouble, Split::even,     true},
  {{"mean_smooth_weights",    Reduction::mean, -100, 0.2, 0.3,  true,  false, 0,   0,    40, 61},  0, at::kDouble, Split::uneven,   true},
  {{"mean_everything",        Reduction::mean, -100, 0.2, 0.25, true,  true,  3.0, 1e-2, 37, 50},  0, at::kDouble, Split::reversed, true},
  {{"mean_ignore_is_a_class", Reduction::mean, 3,    0.0, 0.1,  false, false, 0,   0,    30, 17},  0, at::kDouble, Split::uneven,   true},
  {{"mean_all_ignored",       Reduction::mean, -100, 1.0, 0.1,  true,  false, 0,   1e-2, 8,  20},  0, at::kDouble, Split::even,     true},
  {{"sum_z_bias",             Reduction::sum,  -100, 0.1, 0.0,  false, true,  0,   5e-2, 33, 45},  0, at::kDouble, Split::reversed, true},
  {{"sum_weights_softcap",    Reduction::sum,  -100, 0.0, 0.1,  true,  false, 1.5, 0,    29, 64},  0, at::kDouble, Split::even,     true},
  {{"none_everything",        Reduction::none, -100, 0.3, 0.15, true,  true,  2.0, 1e-2, 22, 45},  0, at::kDouble, Split::uneven,   true},
  {{"vocab_blocks_mean",      Reduction::mean, -100, 0.1, 0.2,  true,  true,  0,   1e-2, 41, 70},  4, at::kDouble, Split::uneven,   true},
  {{"vocab_blocks_none",      Reduction::none, -100, 0.1, 0.0,  false, true,  2.0, 0,    41, 70},  5, at::kDouble, Split::reversed, true},
  {{"float32_everything",     Reduction::mean, -100, 0.2, 0.2,  true,  true,  2.5, 1e-3, 64, 300}, 0, at::kFloat,  Split::uneven,   true},
  {{"no_grad",                Reduction::mean, -100, 0.1, 0.1,  true,  true,  0,   1e-2, 40, 61},  0, at::kDouble, Split::uneven,   false},
};
// clang-format on

const Case* find_case(const std::string& name) {
  for (const Case& c : kCases) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

// Rank r's shard, [first class, class count).
std::pair<std::int64_t, std::int64_t> shard_of(int rank, int world, std::int64_t vocab,
                                               Split split) {
  std::vector<std::int64_t> sizes(world);
  if (split == Split::even) {
    for (int r = 0; r < world; ++r) sizes[r] = vocab / world;
    sizes[world - 1] += vocab % world;
  } else {
    const std::int64_t parts = static_cast<std::int64_t>(world) * (world + 1) / 2;
    std::int64_t given = 0;
    for (int r = 0; r < world; ++r) {
      sizes[r] = vocab * (r + 1) / parts;
      given += sizes[r];
    }
    sizes[world - 1] += vocab - given;
  }
  const int slot = split == Split::reversed ? world - 1 - rank : rank;
  std::int64_t start = 0;
  for (int r = 0; r < slot; ++r) start += sizes[r];
  return {start, sizes[slot]};
}

keel::comm::CommOptions comm_options(const Args& a) {
  keel::comm::CommOptions o;
  o.rendezvous = "tcp://127.0.0.1:" + std::to_string(a.port);
  o.rank = a.rank;
  o.world_size = a.world;
  o.timeout = Millis(30000);
  o.heartbeat_interval = Millis(100);
  o.peer_timeout = Millis(1000);
  return o;
}

// The whole problem in float64, the same on every rank (one seed).
struct Problem {
  at::Tensor hidden, weight, target, class_weights, bias, upstream;
};

Problem make_problem(const Case& c) {
  at::manual_seed(1234);
  const keel::testing::LossInputs in = keel::testing::make_loss_inputs(c, kDim, 0.4);
  Problem p{in.hidden, in.weight, in.target, in.class_weights, in.bias, {}};
  p.upstream = at::randn({c.tokens}, at::kDouble);
  // The values keel sees, rounded to the case's dtype, are the reference's.
  const auto round = [&](at::Tensor& t) {
    if (t.defined()) t = t.to(c.dtype).to(at::kDouble);
  };
  round(p.hidden);
  round(p.weight);
  round(p.bias);
  if (p.class_weights.defined()) p.class_weights = p.class_weights.to(at::kFloat).to(at::kDouble);
  return p;
}

double max_relative_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble);
  const at::Tensor both_nan = g.isnan().logical_and(want.isnan());
  const at::Tensor diff = at::where(both_nan, at::zeros_like(g), (g - want).abs());
  return (diff.max() / want.abs().nan_to_num(0).max().clamp_min(1e-300)).item<double>();
}

void expect_close(const at::Tensor& got, const at::Tensor& want, double tol,
                  const std::string& what) {
  if (!got.defined() || got.sizes() != want.sizes()) {
    fail(what + ": missing or of the wrong shape");
    return;
  }
  const double err = max_relative_error(got, want);
  if (!(err <= tol)) fail(what + ": max relative error " + std::to_string(err));
}

std::string bits(const at::Tensor& scalar) {
  const double x = scalar.to(at::kDouble).item<double>();
  std::uint64_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  char text[32];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(b));
  return text;
}

LinearCrossEntropyOptions options_for(const Case& c, const Problem& p, Communicator& comm,
                                      std::int64_t start, std::int64_t classes) {
  LinearCrossEntropyOptions o;
  o.reduction = c.reduction;
  o.ignore_index = c.ignore_index;
  o.label_smoothing = c.label_smoothing;
  o.z_loss = c.z_loss;
  o.logit_softcap = c.logit_softcap;
  o.vocab_chunk_size = c.vocab_chunk;
  if (c.class_weights) o.class_weights = p.class_weights.narrow(0, start, classes).to(at::kFloat);
  if (c.bias) o.bias = p.bias.narrow(0, start, classes).to(c.dtype).requires_grad_(c.grad);
  o.return_per_token_loss = true;
  o.return_lse = true;
  o.vocab_parallel.communicator = comm;
  o.vocab_parallel.vocab_start = start;
  return o;
}

int run_case(const Args& a, Communicator& comm) {
  const Case* found = find_case(a.case_name);
  if (found == nullptr) {
    std::cerr << "unknown case " << a.case_name << "\n";
    return 2;
  }
  const Case& c = *found;
  const Problem p = make_problem(c);
  const auto [start, classes] = shard_of(a.rank, a.world, c.vocab, c.split);
  std::cout << "rank " << a.rank << " holds classes [" << start << ", " << start + classes << ")"
            << std::endl;

  const at::Tensor h = p.hidden.to(c.dtype).requires_grad_(c.grad);
  const at::Tensor w = p.weight.narrow(0, start, classes).to(c.dtype).requires_grad_(c.grad);
  LinearCrossEntropyOptions o = options_for(c, p, comm, start, classes);
  const keel::result<keel::LossOutput> r = [&] {
    const at::AutoGradMode grad_mode(c.grad);
    return keel::linear_cross_entropy(h, w, p.target, o);
  }();
  if (!r) {
    fail("linear_cross_entropy: " + r.error().to_string());
    return 1;
  }
  const keel::LossOutput& out = r.value();

  // The reference: the whole vocabulary, unsharded, in float64.
  const at::Tensor h64 = p.hidden.clone().requires_grad_(true);
  const at::Tensor w64 = p.weight.clone().requires_grad_(true);
  keel::reference::LinearCrossEntropyCase rc =
      keel::testing::reference_case(c, {p.hidden, p.weight, p.target, p.class_weights, p.bias});
  if (rc.bias.defined()) rc.bias = rc.bias.clone().requires_grad_(true);
  const auto ref = keel::reference::linear_cross_entropy(h64, w64, p.target, rc);

  // float64 is exact to rounding; float32 as the unsharded conformance suite.
  const bool f64 = c.dtype == at::kDouble;
  const double tol = f64 ? 1e-11 : 1e-5;
  expect_close(out.loss.detach(), ref.loss.detach(), tol, "loss");
  expect_close(out.per_token_loss, ref.per_token.detach(), tol, "per-token loss");
  expect_close(out.lse, ref.lse, tol, "lse");
  std::cout << "LOSS " << bits(out.loss.detach().sum()) << " PER_TOKEN "
            << bits(out.per_token_loss.sum()) << std::endl;
  if (!c.grad) {
    if (out.loss.requires_grad()) fail("no_grad loss requires grad");
    return failures == 0 ? 0 : 1;
  }

  std::vector<at::Tensor> mine{h, w};
  std::vector<at::Tensor> theirs{h64, w64};
  if (c.bias) {
    mine.push_back(o.bias);
    theirs.push_back(rc.bias);
  }
  const auto grads_of = [&](const at::Tensor& loss, const std::vector<at::Tensor>& leaves) {
    if (loss.dim() == 0) return torch::autograd::grad({loss}, leaves);
    return torch::autograd::grad({loss}, leaves, {p.upstream.to(loss.scalar_type())});
  };
  const std::vector<at::Tensor> got = grads_of(out.loss, mine);
  const std::vector<at::Tensor> want = grads_of(ref.loss, theirs);
  const double grad_tol = f64 ? 1e-10 : 5e-5;
  expect_close(got[0], want[0], grad_tol, "grad hidden (summed across the ranks)");
  expect_close(got[1], want[1].narrow(0, start, classes), grad_tol, "grad weight (this shard)");
  if (c.bias) expect_close(got[2], want[2].narrow(0, start, classes), grad_tol, "grad bias");
  return failures == 0 ? 0 : 1;
}

// A small valid call for the error scenarios: [12, 8] tokens over 20 classes.
struct Small {
  at::Tensor hidden = at::randn({12, 8}, at::kDouble);
  at::Tensor target = at::randint(0, 20, {12}, at::kLong);
  at::Tensor weight;
  LinearCrossEntropyOptions options;
};

Small small(const Args& a, Communicator& comm) {
  at::manual_seed(5);
  Small s;
  const auto [start, classes] = shard_of(a.rank, a.world, 20, Split::uneven);
  s.weight = at::randn({classes, 8}, at::kDouble);
  s.options.vocab_parallel.communicator = comm;
  s.options.vocab_parallel.vocab_start = start;
  return s;
}

void expect_error(const keel::result<keel::LossOutput>& r, Errc code, const std::string& text,
                  const std::string& what) {
  if (r) {
    fail(what + ": succeeded");
  } else if (r.error().code() != code || r.error().message().find(text) == std::string::npos) {
    fail(what + ": got " + r.error().to_string() + "; expected " +
         std::string(keel::to_string(code)) + " naming '" + text + "'");
  } else {
    std::cout << "expected error: " << r.error().to_string() << std::endl;
  }
}

// The last rank passes a wrong call; afterwards all do a valid one, which
// must still work (the group is unharmed).
int bad_input(const Args& a, Communicator& comm) {
  Small s = small(a, comm);
  const int bad = a.world - 1;
  if (a.rank == bad) s.weight = at::randn({s.weight.size(0), 7}, at::kDouble);
  const auto r = keel::linear_cross_entropy(s.hidden, s.weight, s.target, s.options);
  if (a.rank == bad) {
    expect_error(r, Errc::invalid_argument, "weight has 7 columns", "the bad rank");
  } else {
    expect_error(r, Errc::invalid_argument, "rank " + std::to_string(bad) + "'s arguments",
                 "a good rank");
  }
  Small again = small(a, comm);
  const auto ok =
      keel::linear_cross_entropy(again.hidden, again.weight, again.target, again.options);
  if (!ok) fail("the call after the bad one: " + ok.error().to_string());
  return failures == 0 ? 0 : 1;
}

int disagree(const Args& a, Communicator& comm) {
  Small s = small(a, comm);
  s.options.label_smoothing = a.rank == a.world - 1 ? 0.2 : 0.1;
  expect_error(keel::linear_cross_entropy(s.hidden, s.weight, s.target, s.options),
               Errc::invalid_argument, "options.label_smoothing differs", "smoothing");
  Small t = small(a, comm);
  if (a.rank == 0) t.target = (t.target + 1).remainder_(20);
  expect_error(keel::linear_cross_entropy(t.hidden, t.weight, t.target, t.options),
               Errc::invalid_argument, "target (the class indices) differs", "targets");
  return failures == 0 ? 0 : 1;
}

int gap(const Args& a, Communicator& comm) {
  Small s = small(a, comm);
  if (a.rank == a.world - 1) s.options.vocab_parallel.vocab_start += 1;
  expect_error(keel::linear_cross_entropy(s.hidden, s.weight, s.target, s.options),
               Errc::invalid_argument, "(a gap)", "gap");
  Small t = small(a, comm);
  if (a.rank == a.world - 1) t.options.vocab_parallel.vocab_start -= 1;
  expect_error(keel::linear_cross_entropy(t.hidden, t.weight, t.target, t.options),
               Errc::invalid_argument, "(a overlap)", "overlap");
  return failures == 0 ? 0 : 1;
}

// A loss large enough to take a while: 4096 tokens, 64 features, 24000
// classes, in chunks of 64 tokens (a collective each).
struct Large {
  at::Tensor hidden = at::randn({4096, 64});
  at::Tensor target = at::randint(0, 24000, {4096}, at::kLong);
  at::Tensor weight;
  LinearCrossEntropyOptions options;
};

Large large(const Args& a, Communicator& comm, Reduction reduction) {
  at::manual_seed(9);
  Large l;
  const auto [start, classes] = shard_of(a.rank, a.world, 24000, Split::even);
  l.weight = at::randn({classes, 64}).requires_grad_(true);
  l.hidden.requires_grad_(true);
  l.options.reduction = reduction;
  l.options.chunk_size = 64;
  l.options.vocab_parallel.communicator = comm;
  l.options.vocab_parallel.vocab_start = start;
  return l;
}

// The last rank SIGKILLs itself 300 ms into a loop of losses; the others
// must get peer_lost naming it within a few peer timeouts.
int die_in_forward(const Args& a, Communicator& comm) {
  const int victim = a.world - 1;
  if (a.rank == victim) {
    std::thread([] {
      std::this_thread::sleep_for(Millis(300));
      ::kill(::getpid(), SIGKILL);
    }).detach();
  }
  const std::int64_t began = now_ms();
  for (int i = 0; i < 200; ++i) {
    Large l = large(a, comm, Reduction::mean);
    const auto r = keel::linear_cross_entropy(l.hidden, l.weight, l.target, l.options);
    if (r) continue;
    expect_error(r, Errc::peer_lost, "rank " + std::to_string(victim), "the survivor");
    std::cout << "losses before the failure " << i << " detected_after_ms "
              << now_ms() - began - 300 << std::endl;
    return failures == 0 ? 0 : 1;
  }
  fail("200 losses passed without an error");
  return 1;
}

// reduction none recomputes in backward: the last rank exits after the
// forward, and the others' backward must throw, naming peer_lost.
int die_before_backward(const Args& a, Communicator& comm) {
  Large l = large(a, comm, Reduction::none);
  const auto r = keel::linear_cross_entropy(l.hidden, l.weight, l.target, l.options);
  if (!r) {
    fail("forward: " + r.error().to_string());
    return 1;
  }
  if (a.rank == a.world - 1) ::_exit(0);
  try {
    r.value().loss.sum().backward();
    fail("backward succeeded without the last rank");
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (what.find("peer_lost") == std::string::npos) fail("backward threw: " + what);
    std::cout << "backward threw: " << what.substr(0, 200) << std::endl;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  Args a;
  a.scenario = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--rank") a.rank = std::stoi(v);
    if (k == "--world") a.world = std::stoi(v);
    if (k == "--port") a.port = std::stoi(v);
    if (k == "--case") a.case_name = v;
  }
  auto made = Communicator::create(comm_options(a));
  if (!made) {
    std::cout << "FAIL create: " << made.error().to_string() << std::endl;
    return 1;
  }
  Communicator comm = made.value();
  int status = 2;
  if (a.scenario == "case") status = run_case(a, comm);
  if (a.scenario == "bad_input") status = bad_input(a, comm);
  if (a.scenario == "disagree") status = disagree(a, comm);
  if (a.scenario == "gap") status = gap(a, comm);
  if (a.scenario == "die_in_forward") status = die_in_forward(a, comm);
  if (a.scenario == "die_before_backward") status = die_before_backward(a, comm);
  std::cout << (status == 0 ? "PASS" : "DONE") << std::endl;
  return status;
}
