// One rank of a distributed test: tests/distributed/comm_test.cpp spawns N of
// these on loopback and reads what they print. Every check compares with
// exact expected values computed here with plain ATen ops.
//
//   keel_comm_worker SCENARIO --rank R --world N --port P [--victim V]
//                    [--backend compat|native] [--op OP] [--release FILE]
//                    [--timeout-ms T] [--external-store 1] [--rejoin 1]
//                    [--expect-missing 1] [--host H] [--op-timeout-ms T]
//                    [--tolerate-errors 1]
//
// Exit 0: the scenario's checks passed; 1: a check failed (printed as
// "FAIL ..."); 2: usage.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "keel/v1/comm.h"
#include "loopback.h"

namespace {

using keel::testing::now_ms;

using keel::Errc;
using keel::comm::CallOptions;
using keel::comm::Communicator;
using keel::comm::ReduceOp;
using Millis = std::chrono::milliseconds;

struct Args {
  std::string scenario;
  int rank = 0;
  int world = 2;
  int port = 0;
  int victim = 1;
  std::string backend = "auto";
  std::string op = "all_reduce";
  std::string release;             // stop: the survivors wait for this file before they leave
  int timeout_ms = 3000;           // unreachable, never_join: create()'s timeout
  bool external_store = false;     // the store is hosted outside the ranks
  bool rejoin = false;             // replace: this process replaces --rank
  bool expect_missing = false;     // replace: no replacement comes; wait --timeout-ms for it
  std::string host = "127.0.0.1";  // where the store is
  int op_timeout_ms = 20000;       // CommOptions::timeout
  bool tolerate_errors = false;    // net_ops: an error ends the run; only wrong numbers fail
};

int failures = 0;

void fail(const std::string& what) {
  std::cout << "FAIL " << what << std::endl;
  ++failures;
}

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type() ||
      !at::equal(got, want)) {
    fail(what + ": result differs from the expected values");
  }
}

template <class R>
bool ok(const R& r, const std::string& what) {
  if (r) return true;
  fail(what + ": " + r.error().to_string());
  return false;
}

keel::comm::CommOptions options(const Args& a) {
  keel::comm::CommOptions o;
  o.rendezvous = "tcp://" + a.host + ":" + std::to_string(a.port) +
                 (a.external_store ? "?store=external" : "");
  o.rank = a.rank;
  o.world_size = a.world;
  o.timeout = Millis(a.op_timeout_ms);
  o.heartbeat_interval = Millis(100);
  o.peer_timeout = Millis(1000);
  if (a.backend == "compat") o.dispatch.backend = keel::Backend::compat;
  if (a.backend == "native") o.dispatch.backend = keel::Backend::native;
  return o;
}

// A rank's input: small integers, exact in every dtype under sum of up to
// 8 ranks; `ones_twos` gives 1s and 2s, whose products stay exact.
at::Tensor input(std::int64_t n, int rank, at::ScalarType dtype, bool ones_twos = false) {
  at::Tensor i = at::arange(n, at::kLong);
  at::Tensor v = ones_twos ? (i + rank) % 2 + 1 : i % 5 + rank + 1;
  return v.to(dtype);
}

// --- every operation, every dtype, every size --------------------------------

void run_ops(Communicator& comm) {
  const int n = comm.size();
  const int me = comm.rank();
  const std::vector<at::ScalarType> dtypes{at::kFloat, at::kBFloat16, at::kLong};
  for (at::ScalarType dtype : dtypes) {
    const std::int64_t elem = static_cast<std::int64_t>(c10::elementSize(dtype));
    // 16 MiB with 2 ranks; 4 ranks stop at 1 MiB (4 ranks share 2 cores in CI).
    const std::int64_t big = (n <= 2 ? (16 << 20) : (1 << 20)) / elem;
    const std::vector<std::int64_t> sizes{0, 1, 7, big};
    for (std::int64_t s : sizes) {
      const std::string tag = std::string(c10::toString(dtype)) + " n=" + std::to_string(s);
      // all_reduce, each op
      for (ReduceOp op :
           {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max, ReduceOp::product}) {
        if (op == ReduceOp::avg && !at::isFloatingType(dtype)) continue;
        const bool product = op == ReduceOp::product;
        at::Tensor t = input(s, me, dtype, product);
        at::Tensor want = input(s, 0, at::kDouble, product);
        for (int r = 1; r < n; ++r) {
          at::Tensor x = input(s, r, at::kDouble, product);
          if (op == ReduceOp::sum || op == ReduceOp::avg) want = want + x;
          if (op == ReduceOp::min) want = at::minimum(want, x);
          if (op == ReduceOp::max) want = at::maximum(want, x);
          if (product) want = want * x;
        }
        if (op == ReduceOp::avg) want = want / n;
        if (ok(comm.all_reduce(t, op), "all_reduce " + tag)) {
          expect_equal(t, want.to(dtype),
                       "all_reduce(" + std::string(keel::comm::to_string(op)) + ") " + tag);
        }
      }
      // all_gather into one tensor and into a list
      std::vector<at::Tensor> parts;
      for (int r = 0; r < n; ++r) parts.push_back(input(s, r, dtype));
      at::Tensor gathered = at::empty({n * s}, at::TensorOptions(dtype));
      if (ok(comm.all_gather(gathered, input(s, me, dtype)), "all_gather " + tag)) {
        expect_equal(gathered, at::cat(parts), "all_gather " + tag);
      }
      std::vector<at::Tensor> list;
      for (int r = 0; r < n; ++r) list.push_back(at::empty({s}, at::TensorOptions(dtype)));
      if (ok(comm.all_gather(list, input(s, me, dtype)), "all_gather(list) " + tag)) {
        for (int r = 0; r < n; ++r) expect_equal(list[r], parts[r], "all_gather(list) " + tag);
      }
      // reduce_scatter: input [n*s], rank r keeps the sum of slice r
      at::Tensor rs_in = input(n * s, me, dtype);
      at::Tensor rs_out = at::empty({s}, at::TensorOptions(dtype));
      at::Tensor rs_want = at::zeros({n * s}, at::kDouble);
      for (int r = 0; r < n; ++r) rs_want = rs_want + input(n * s, r, at::kDouble);
      if (ok(comm.reduce_scatter(rs_out, rs_in), "reduce_scatter " + tag)) {
        expect_equal(rs_out, rs_want.slice(0, me * s, (me + 1) * s).to(dtype),
                     "reduce_scatter " + tag);
      }
      // broadcast from the last rank
      at::Tensor b = input(s, me, dtype);
      if (ok(comm.broadcast(b, n - 1), "broadcast " + tag)) {
        expect_equal(b, input(s, n - 1, dtype), "broadcast " + tag);
      }
      // all_to_all, equal splits: rank r's block j goes to rank j
      at::Tensor a_in = input(n * s, me, dtype);
      at::Tensor a_out = at::empty({n * s}, at::TensorOptions(dtype));
      if (ok(comm.all_to_all(a_out, a_in), "all_to_all " + tag)) {
        std::vector<at::Tensor> blocks;
        for (int r = 0; r < n; ++r)
          blocks.push_back(input(n * s, r, dtype).slice(0, me * s, (me + 1) * s));
        expect_equal(a_out, at::cat(blocks), "all_to_all " + tag);
      }
      // all_to_all, given splits: rank r sends (r + j) % 3 * ... rows to j
      if (s <= 7) {
        auto rows = [&](int from, int to) {
          return static_cast<std::int64_t>((from + 2 * to) % 3) * s;
        };
        std::vector<std::int64_t> in_splits, out_splits;
        std::int64_t out_rows = 0;
        for (int j = 0; j < n; ++j) {
          in_splits.push_back(rows(me, j));
          out_splits.push_back(rows(j, me));
          out_rows += out_splits.back();
        }
        auto source = [&](int r) {
          std::int64_t total = 0;
          for (int j = 0; j < n; ++j) total += rows(r, j);
          return input(total, r, dtype);
        };
        at::Tensor v_out = at::empty({out_rows}, at::TensorOptions(dtype));
        if (ok(comm.all_to_all(v_out, source(me), out_splits, in_splits),
               "all_to_all(splits) " + tag)) {
          std::vector<at::Tensor> blocks;
          for (int r = 0; r < n; ++r) {
            std::int64_t off = 0;
            for (int j = 0; j < me; ++j) off += rows(r, j);
            blocks.push_back(source(r).slice(0, off, off + rows(r, me)));
          }
          expect_equal(v_out, at::cat(blocks), "all_to_all(splits) " + tag);
        }
      }
      // send/recv around a ring
      at::Tensor to_next = input(s, me, dtype);
      at::Tensor from_prev = at::empty({s}, at::TensorOptions(dtype));
      const int next = (me + 1) % n;
      const int prev = (me + n - 1) % n;
      auto sent = comm.send_async(to_next, next, 3);
      auto got = comm.recv_async(from_prev, prev, 3);
      if (ok(sent, "send " + tag) && ok(got, "recv " + tag)) {
        if (ok(got.value().wait(), "recv " + tag) && ok(sent.value().wait(), "send " + tag)) {
          expect_equal(from_prev, input(s, prev, dtype), "send/recv " + tag);
        }
      }
    }
  }
  ok(comm.barrier(), "barrier");
}

// One collective of kind `op` on 1 MiB float32 tensors of rank-dependent
// values, checked exactly: a wrong result is a FAIL line (and exit 1), which
// the soak counts apart from a hang or a missed detection.
keel::result<void> one_op(Communicator& comm, const std::string& op) {
  const int n = comm.size();
  const int me = comm.rank();
  const std::int64_t s = 1 << 18;
  // Rank r contributes r + 1, or (for all_to_all) r * n + j to rank j.
  const auto mine = [&](std::int64_t numel) {
    return at::full({numel}, static_cast<double>(me + 1));
  };
  const auto blocks_of = [&](auto value) {
    std::vector<at::Tensor> blocks;
    for (int j = 0; j < n; ++j) blocks.push_back(at::full({s}, static_cast<double>(value(j))));
    return at::cat(blocks);
  };
  const double sum = n * (n + 1) / 2.0;
  keel::result<void> r = keel::success();
  at::Tensor got;
  at::Tensor want;
  if (op == "all_reduce") {
    got = mine(s);
    r = comm.all_reduce(got);
    want = at::full({s}, sum);
  } else if (op == "all_gather") {
    got = at::empty({n * s});
    r = comm.all_gather(got, mine(s));
    want = blocks_of([](int j) { return j + 1; });
  } else if (op == "reduce_scatter") {
    got = at::empty({s});
    r = comm.reduce_scatter(got, mine(n * s));
    want = at::full({s}, sum);
  } else if (op == "broadcast") {
    got = mine(s);
    r = comm.broadcast(got, 0);
    want = at::full({s}, 1.0);
  } else if (op == "all_to_all") {
    got = at::empty({n * s});
    r = comm.all_to_all(got, blocks_of([&](int j) { return me * n + j; }));
    want = blocks_of([&](int j) { return j * n + me; });
  } else if (op == "send_recv") {
    got = at::empty({s});
    auto a = comm.send_async(mine(s), (me + 1) % n);
    if (!a) return a.error();
    auto b = comm.recv_async(got, (me + n - 1) % n);
    if (!b) return b.error();
    r = b.value().wait();
    if (r) r = a.value().wait();
    want = at::full({s}, static_cast<double>((me + n - 1) % n + 1));
  } else {
    return comm.barrier();
  }
  if (r) expect_equal(got, want, op);
  return r;
}

// After the victim died: the survivors form a new world, then check `op`
// and a sum on it.
void reform_and_check(Communicator& comm, int survivors, const std::string& op) {
  auto next = comm.reform();
  if (!ok(next, "reform")) return;
  Communicator& c = next.value();
  if (c.size() != survivors) {
    fail("reform: size " + std::to_string(c.size()) + ", expected " + std::to_string(survivors));
    return;
  }
  // A world of one has no peer to send to.
  if (op != "send_recv" || c.size() > 1) ok(one_op(c, op), op + " after reform");
  at::Tensor t = at::full({1000}, static_cast<double>(c.rank() + 1));
  if (ok(c.all_reduce(t), "all_reduce after reform")) {
    expect_equal(t, at::full({1000}, survivors * (survivors + 1) / 2.0), "all_reduce after reform");
  }
  std::cout << "REFORMED generation " << c.generation() << " rank " << c.rank() << "/" << c.size()
            << std::endl;
  ok(c.barrier(), "barrier after reform");
}

// comm.h's promise: create() ends within its timeout plus 1 s.
void within_bound(Millis took, int timeout_ms) {
  if (took > Millis(timeout_ms + 1000)) {
    fail("create took " + std::to_string(took.count()) + " ms, beyond its timeout of " +
         std::to_string(timeout_ms) + " ms plus 1 s");
  }
}

// A rank that was stopped while its peers re-formed without it: once it
// resumes, its old group has failed (printed above), and joining the next
// generation must be refused, never a hang or a seat in the new group.
int stale_rank_is_fenced(const Communicator& comm) {
  keel::comm::ReformOptions o;
  o.timeout = Millis(10000);
  auto next = comm.reform(o);
  if (next) {
    fail("a stale rank joined generation " + std::to_string(next.value().generation()));
    return 1;
  }
  std::cout << "FENCED " << now_ms() << " " << next.error().to_string() << std::endl;
  if (next.error().code() != Errc::timeout ||
      next.error().message().find("left out of generation") == std::string::npos) {
    fail("expected the stale rank to be left out, got " + next.error().to_string());
  }
  return failures == 0 ? 0 : 1;
}

// The new generation works until the test releases it: each round's sum
// carries, in its last element, how many ranks saw the release file (none
// given: one round), so that the ranks leave together.
void rounds_until_released(Communicator& c, const std::string& release) {
  const auto deadline = std::chrono::steady_clock::now() + Millis(60000);
  int rounds = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    at::Tensor t = at::full({65}, static_cast<double>(c.rank() + 1));
    t[64] = release.empty() || std::filesystem::exists(release) ? 1.0 : 0.0;
    if (!ok(c.all_reduce(t), "all_reduce in the new generation")) break;
    expect_equal(t.slice(0, 0, 64), at::full({64}, c.size() * (c.size() + 1) / 2.0),
                 "all_reduce in the new generation");
    ++rounds;
    if (t[64].item<double>() > 0) break;
    std::this_thread::sleep_for(Millis(20));
  }
  std::cout << "NEW GENERATION ROUNDS " << rounds << std::endl;
  ok(c.barrier(), "final barrier of the new generation");
}

// A rank of generation `g` of a world that grew back to its full size:
// same size, same rank, `op` and sums exact.
void check_full_world(Communicator& c, const Args& a, int rank, const std::string& how) {
  std::cout << how << " generation " << c.generation() << " rank " << c.rank() << "/" << c.size()
            << "\nGREW " << now_ms() << std::endl;
  if (c.size() != a.world || c.rank() != rank) {
    fail(how + ": rank " + std::to_string(c.rank()) + "/" + std::to_string(c.size()) +
         ", expected " + std::to_string(rank) + "/" + std::to_string(a.world));
    return;
  }
  ok(one_op(c, a.op), a.op + " in the grown-back world");
  rounds_until_released(c, a.release);
}

// issue 18 item 1: the victim dies (or stops) and a replacement process
// takes its seat; the survivors wait for it and the world grows back.
int replace(const Args& a) {
  auto o = options(a);
  if (a.rejoin) {
    o.rejoin = true;
    auto made = Communicator::create(o);
    if (!ok(made, "rejoin")) return 1;
    check_full_world(made.value(), a, a.rank, "REJOINED");
    return failures == 0 ? 0 : 1;
  }
  auto made = Communicator::create(o);
  if (!ok(made, "create")) return 1;
  Communicator comm = made.value();
  std::cout << "READY " << now_ms() << std::endl;
  keel::result<void> r = keel::success();
  while ((r = one_op(comm, a.op))) {
  }
  std::cout << "DETECTED " << now_ms() << " " << r.error().to_string() << std::endl;
  keel::comm::ReformOptions grow;
  grow.wait_for_replacements = true;
  grow.timeout = Millis(a.timeout_ms);
  if (a.rank == a.victim && a.scenario == "partition") {
    // Cut off, then joined again: this process takes its own seat back, by
    // reform, or (if its store connection did not survive the cut) as its
    // own replacement.
    auto back = comm.reform(grow);
    if (!back) {
      std::cout << "REFORM " << back.error().to_string() << "; rejoining" << std::endl;
      o.rejoin = true;
      back = Communicator::create(o);
    }
    if (ok(back, "back after the partition")) check_full_world(back.value(), a, a.rank, "REFORMED");
    return failures == 0 ? 0 : 1;
  }
  if (a.rank == a.victim) return stale_rank_is_fenced(comm);
  if (r.error().code() != Errc::peer_lost ||
      r.error().message().find("rank " + std::to_string(a.victim)) == std::string::npos) {
    fail("expected peer_lost naming rank " + std::to_string(a.victim) + ", got " +
         r.error().to_string());
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto full = comm.reform(grow);
  const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - t0);
  if (!a.expect_missing) {
    if (ok(full, "reform waiting for the replacement")) {
      check_full_world(full.value(), a, a.rank, "REFORMED");
    }
    return failures == 0 ? 0 : 1;
  }
  std::cout << "MISSING " << took.count() << " " << (full ? "none" : full.error().to_string())
            << std::endl;
  if (full || full.error().code() != Errc::timeout ||
      full.error().message().find("rank " + std::to_string(a.victim)) == std::string::npos) {
    fail("expected timeout naming rank " + std::to_string(a.victim) + ", got " +
         (full ? std::string("a world") : full.error().to_string()));
  }
  if (took > Millis(a.timeout_ms + 1000)) {
    fail("reform took " + std::to_string(took.count()) + " ms, beyond its timeout");
  }
  reform_and_check(comm, a.world - 1, a.op);
  return failures == 0 ? 0 : 1;
}

// Every collective twice, each checked exactly, over a network the test
// degrades: an error (tolerated under packet loss) ends the run; a wrong
// number is always a failure.
int net_ops(const Args& a) {
  auto made = Communicator::create(options(a));
  if (!ok(made, "create")) return 1;
  Communicator comm = made.value();
  std::cout << "READY " << now_ms() << std::endl;
  const auto t0 = std::chrono::steady_clock::now();
  int done = 0;
  for (int round = 0; round < 2; ++round) {
    for (const char* op : {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
                           "send_recv", "barrier"}) {
      auto r = one_op(comm, op);
      if (!r) {
        std::cout << "ERROR " << op << " " << r.error().to_string() << std::endl;
        if (!a.tolerate_errors) fail(std::string(op) + ": " + r.error().to_string());
        return failures == 0 ? 0 : 1;
      }
      ++done;
    }
  }
  ok(comm.barrier(), "final barrier");
  const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - t0);
  std::cout << "OPS " << done << " in " << took.count() << " ms" << std::endl;
  return failures == 0 ? 0 : 1;
}

int run(const Args& a) {
  std::cout << "START " << now_ms() << std::endl;
  if (a.scenario == "replace" || a.scenario == "partition") return replace(a);
  if (a.scenario == "net_ops") return net_ops(a);
  if (a.scenario == "unreachable") {
    // Nobody hosts the store at the port (this process is rank 1 of 2,
    // whatever --rank says): create() must give up within its timeout plus
    // the documented slack.
    auto o = options(a);
    o.rank = 1;
    o.timeout = Millis(a.timeout_ms);
    const auto t0 = std::chrono::steady_clock::now();
    auto made = Communicator::create(o);
    const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - t0);
    std::cout << "TOOK " << took.count() << " " << (made ? "created" : made.error().to_string())
              << std::endl;
    if (made || made.error().code() != Errc::timeout) {
      fail("create: expected timeout, got " +
           (made ? std::string("a communicator") : made.error().to_string()));
    }
    within_bound(took, a.timeout_ms);
    return failures == 0 ? 0 : 1;
  }
  if (a.scenario == "never_join") {
    auto o = options(a);
    o.timeout = Millis(a.timeout_ms);
    const auto t0 = std::chrono::steady_clock::now();
    auto made = Communicator::create(o);
    const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - t0);
    std::cout << "TOOK " << took.count() << std::endl;
    within_bound(took, a.timeout_ms);
    if (made) {
      fail("create succeeded although a rank never joined");
    } else if (!(made.error().code() == Errc::timeout &&
                 made.error().message().find("rank " + std::to_string(a.victim)) !=
                     std::string::npos) &&
               !(a.rank != 0 && made.error().code() == Errc::peer_lost &&
                 made.error().message().find("rank 0, which hosts the store") !=
                     std::string::npos)) {
      // Rank 0 hosts the store and names the missing rank; another rank
      // may instead see rank 0 leave first.
      fail("create: expected timeout naming rank " + std::to_string(a.victim) + ", got " +
           made.error().to_string());
    }
    std::cout << "ERROR " << (made ? "none" : made.error().to_string()) << std::endl;
    return failures == 0 ? 0 : 1;
  }

  auto o = options(a);
  o.checked = a.scenario == "checked";
  auto made = Communicator::create(o);
  if (!ok(made, "create")) return 1;
  Communicator comm = made.value();
  std::cout << "READY " << now_ms() << " adapter " << comm.dispatch_info().adapter << std::endl;

  if (a.scenario == "ops") {
    run_ops(comm);
  } else if (a.scenario == "kill" || a.scenario == "exit_early" || a.scenario == "stop") {
    // Loop the op until a failure; the victim dies (SIGKILL from the test,
    // or a clean exit here) or stops (SIGSTOP) and the survivors must name
    // it.
    if (a.scenario == "exit_early" && a.rank == a.victim) {
      ok(one_op(comm, a.op), "first " + a.op);
      std::cout << "LEAVING " << now_ms() << std::endl;
      return failures == 0 ? 0 : 1;  // destroys the communicator: "left"
    }
    if (a.scenario == "exit_early") ok(one_op(comm, a.op), "first " + a.op);
    while (true) {
      auto r = one_op(comm, a.op);
      if (r) continue;
      std::cout << "DETECTED " << now_ms() << " " << r.error().to_string() << std::endl;
      if (a.scenario == "stop" && a.rank == a.victim) return stale_rank_is_fenced(comm);
      if (r.error().code() != Errc::peer_lost) {
        fail("expected peer_lost, got " + r.error().to_string());
      } else if (r.error().message().find("rank " + std::to_string(a.victim)) ==
                 std::string::npos) {
        fail("peer_lost does not name rank " + std::to_string(a.victim) + ": " +
             r.error().message());
      }
      auto again = comm.barrier();
      if (again || again.error().code() != Errc::aborted) {
        fail("a call after the failure must return aborted");
      }
      break;
    }
    if (a.scenario == "stop") {
      // The new generation keeps working while the stale rank resumes and
      // tries to rejoin; it leaves only when the test releases it (rank 0
      // hosts the store the stale rank must be fenced by).
      auto next = comm.reform();
      if (!ok(next, "reform")) return 1;
      Communicator& c = next.value();
      std::cout << "REFORMED generation " << c.generation() << " rank " << c.rank() << "/"
                << c.size() << std::endl;
      rounds_until_released(c, a.release);
      return failures == 0 ? 0 : 1;
    }
    reform_and_check(comm, a.world - 1, a.op);
    return failures == 0 ? 0 : 1;  // the old group is aborted: no final barrier
  } else if (a.scenario == "skip") {
    // The victim skips one all_reduce: the others time out; nobody hangs.
    at::Tensor t = at::ones({16});
    if (a.rank != a.victim) {
      CallOptions call;
      call.timeout = Millis(1500);
      const auto t0 = std::chrono::steady_clock::now();
      auto r = comm.all_reduce(t, ReduceOp::sum, call);
      const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - t0);
      std::cout << "ERROR " << (r ? "none" : r.error().to_string()) << std::endl;
      if (r || r.error().code() != Errc::timeout) fail("expected timeout");
      if (took > Millis(5000)) fail("timeout took " + std::to_string(took.count()) + " ms");
    } else {
      std::this_thread::sleep_for(Millis(3000));
    }
    return failures == 0 ? 0 : 1;
  } else if (a.scenario == "abort") {
    // Rank 0 waits on an all_reduce nobody else issues; another thread
    // aborts; the wait ends with aborted and so does every later call.
    if (a.rank == 0) {
      at::Tensor t = at::ones({16});
      auto w = comm.all_reduce_async(t);
      if (ok(w, "all_reduce_async")) {
        std::thread killer([comm]() mutable {
          std::this_thread::sleep_for(Millis(300));
          comm.abort();
        });
        const auto t0 = std::chrono::steady_clock::now();
        auto r = w.value().wait();
        const auto took = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - t0);
        killer.join();
        std::cout << "ERROR " << (r ? "none" : r.error().to_string()) << std::endl;
        if (r || r.error().code() != Errc::aborted) fail("wait: expected aborted");
        if (took > Millis(2000)) fail("abort took " + std::to_string(took.count()) + " ms");
        auto later = comm.all_reduce(t);
        if (later || later.error().code() != Errc::aborted) fail("later call: expected aborted");
        if (!comm.is_aborted()) fail("is_aborted() is false after abort()");
        auto trace = comm.dump_flight_recorder();
        if (ok(trace, "dump_flight_recorder")) std::cout << "TRACE " << trace.value() << std::endl;
      }
    } else {
      std::this_thread::sleep_for(Millis(1500));
    }
    return failures == 0 ? 0 : 1;
  } else if (a.scenario == "concurrent") {
    // reduce_scatter on a dedicated group while all_gather runs on the world.
    auto rs_group = comm.dedicated("reduce-scatter");
    if (!ok(rs_group, "dedicated")) return 1;
    const int n = comm.size();
    const std::int64_t s = 1 << 20;
    for (int round = 0; round < 3; ++round) {
      at::Tensor rs_in = input(n * s, comm.rank(), at::kFloat);
      at::Tensor rs_out = at::empty({s});
      at::Tensor ag_out = at::empty({n * s});
      auto rs = rs_group.value().reduce_scatter_async(rs_out, rs_in);
      auto ag = comm.all_gather_async(ag_out, input(s, comm.rank(), at::kFloat));
      if (!ok(rs, "reduce_scatter_async") || !ok(ag, "all_gather_async")) break;
      ok(ag.value().wait(), "all_gather wait");
      ok(rs.value().wait(), "reduce_scatter wait");
      at::Tensor want = at::zeros({n * s}, at::kDouble);
      std::vector<at::Tensor> parts;
      for (int r = 0; r < n; ++r) {
        want = want + input(n * s, r, at::kDouble);
        parts.push_back(input(s, r, at::kFloat));
      }
      expect_equal(rs_out, want.slice(0, comm.rank() * s, (comm.rank() + 1) * s).to(at::kFloat),
                   "concurrent reduce_scatter");
      expect_equal(ag_out, at::cat(parts), "concurrent all_gather");
    }
  } else if (a.scenario == "checked") {
    // Checked mode: rank 1 gives a wrong shape; every rank gets
    // invalid_argument naming it, and the group stays usable.
    at::Tensor t = at::ones({a.rank == 1 ? 5 : 4});
    auto r = comm.all_reduce(t);
    std::cout << "ERROR " << (r ? "none" : r.error().to_string()) << std::endl;
    if (r || r.error().code() != Errc::invalid_argument ||
        r.error().message().find("rank 1: float32 [5]") == std::string::npos) {
      fail("checked all_reduce: expected invalid_argument naming rank 1's shape");
    }
    at::Tensor u = at::ones({4});
    if (ok(comm.all_reduce(u), "checked all_reduce after a rejected one")) {
      expect_equal(u, at::full({4}, static_cast<float>(a.world)), "checked all_reduce");
    }
  } else if (a.scenario == "split") {
    // Even and odd ranks form sub-groups and sum their world ranks.
    std::vector<int> mine;
    for (int r = a.rank % 2; r < a.world; r += 2) mine.push_back(r);
    auto sub = comm.split(mine, a.rank % 2 == 0 ? "even" : "odd");
    if (!ok(sub, "split")) return 1;
    at::Tensor t = at::full({3}, static_cast<double>(a.rank), at::kLong);
    std::int64_t want = 0;
    for (int r : mine) want += r;
    if (ok(sub.value().all_reduce(t), "split all_reduce")) {
      expect_equal(t, at::full({3}, want, at::kLong), "split all_reduce");
    }
  } else {
    std::cerr << "unknown scenario " << a.scenario << "\n";
    return 2;
  }
  ok(comm.barrier(), "final barrier");  // rank 0 hosts the store: leave together
  std::cout << "DONE " << failures << std::endl;
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (argc < 2) {
    std::cerr << "usage: keel_comm_worker SCENARIO --rank R --world N --port P ...\n";
    return 2;
  }
  a.scenario = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--rank")
      a.rank = std::atoi(v.c_str());
    else if (k == "--world")
      a.world = std::atoi(v.c_str());
    else if (k == "--port")
      a.port = std::atoi(v.c_str());
    else if (k == "--victim")
      a.victim = std::atoi(v.c_str());
    else if (k == "--backend")
      a.backend = v;
    else if (k == "--op")
      a.op = v;
    else if (k == "--release")
      a.release = v;
    else if (k == "--timeout-ms")
      a.timeout_ms = std::atoi(v.c_str());
    else if (k == "--external-store")
      a.external_store = v == "1";
    else if (k == "--rejoin")
      a.rejoin = v == "1";
    else if (k == "--expect-missing")
      a.expect_missing = v == "1";
    else if (k == "--host")
      a.host = v;
    else if (k == "--op-timeout-ms")
      a.op_timeout_ms = std::atoi(v.c_str());
    else if (k == "--tolerate-errors")
      a.tolerate_errors = v == "1";
    else {
      std::cerr << "unknown argument " << k << "\n";
      return 2;
    }
  }
  return run(a);
}
