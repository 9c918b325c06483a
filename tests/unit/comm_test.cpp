// The Communicator in one process: options, environment and argument
// checks (each a keel::Error naming the argument), and a world of one rank,
// whose collectives are identities. Multi-rank behaviour is in
// tests/distributed/.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <ATen/ATen.h>

#include "keel/v1/comm.h"
#include "support/scoped_env.h"

namespace {

using keel::Errc;
using keel::comm::CommOptions;
using keel::comm::Communicator;
using keel::comm::ReduceOp;
using keel::testing::ScopedEnv;

std::string temp_store() {
  static int counter = 0;
  return (std::filesystem::temp_directory_path() /
          ("keel-comm-unit-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
      .string();
}

CommOptions single() {
  CommOptions o;
  o.rendezvous = "file://" + temp_store();
  o.rank = 0;
  o.world_size = 1;
  o.timeout = std::chrono::seconds(10);
  return o;
}

void expect_error(const keel::Error& e, Errc code, const std::string& names) {
  EXPECT_EQ(e.code(), code) << e.to_string();
  EXPECT_NE(e.message().find(names), std::string::npos) << e.to_string();
}

TEST(CommOptions, BadOptionsNameTheArgument) {
  struct Case {
    std::function<void(CommOptions&)> change;
    std::string names;
  };
  const std::vector<Case> cases{
      {[](CommOptions& o) { o.rendezvous = "udp://x"; }, "expected env://, tcp://host:port"},
      {[](CommOptions& o) { o.rendezvous = "tcp://host"; }, "expected tcp://host:port"},
      {[](CommOptions& o) { o.rendezvous = "tcp://host:0"; }, "port \"0\""},
      {[](CommOptions& o) { o.rendezvous = "tcp://host:http"; }, "port \"http\""},
      {[](CommOptions& o) { o.rendezvous = "tcp://host:29500?store=rank0"; },
       "the only query keel knows is ?store=external"},
      {[](CommOptions& o) { o.rendezvous = "file://"; }, "expected file://path"},
      {[](CommOptions& o) { o.rank = 1; }, "rank: expected in [0, 1), got 1"},
      {[](CommOptions& o) { o.rank = -1; }, "rank: expected in [0, 1), got -1"},
      {[](CommOptions& o) { o.world_size = 0; }, "world size: expected >= 1"},
      {[](CommOptions& o) { o.timeout = std::chrono::milliseconds(0); }, "timeout: expected > 0"},
      {[](CommOptions& o) { o.heartbeat_interval = std::chrono::milliseconds(0); },
       "heartbeat_interval"},
      {[](CommOptions& o) { o.peer_timeout = std::chrono::milliseconds(10); }, "peer_timeout"},
      {[](CommOptions& o) { o.flight_recorder_entries = 0; }, "flight_recorder_entries"},
      {[](CommOptions& o) { o.name = "a/b"; }, "name: expected a non-empty name without '/'"},
      {[](CommOptions& o) { o.name = ""; }, "name: expected"},
      {[](CommOptions& o) { o.generation = -2; }, "generation: expected >= 0"},
      {[](CommOptions& o) { o.backend = keel::comm::CommBackend::nccl; }, "device: backend nccl"},
      {[](CommOptions& o) { o.backend = static_cast<keel::comm::CommBackend>(9); }, "backend"},
      {[](CommOptions& o) {
         o.device = at::Device(at::kCUDA, 0);
         o.backend = keel::comm::CommBackend::gloo;
       },
       "device: backend gloo serves CPU tensors"},
      {[](CommOptions& o) { o.dispatch.backend = static_cast<keel::Backend>(9); }, "backend"},
  };
  for (const Case& c : cases) {
    CommOptions o = single();
    c.change(o);
    auto made = Communicator::create(o);
    ASSERT_FALSE(made) << c.names;
    expect_error(made.error(), Errc::invalid_argument, c.names);
  }
}

TEST(CommOptions, EnvironmentIsParsedAsTorchrunAndSlurmSetIt) {
  CommOptions o;
  o.rendezvous = "env://";
  {
    ScopedEnv a("RANK", nullptr), b("WORLD_SIZE", nullptr), c("SLURM_PROCID", nullptr),
        d("SLURM_NTASKS", nullptr);
    auto made = Communicator::create(o);
    ASSERT_FALSE(made);
    expect_error(made.error(), Errc::invalid_argument, "world size: not given");
  }
  {
    ScopedEnv a("RANK", "zero"), b("WORLD_SIZE", "1");
    auto made = Communicator::create(o);
    ASSERT_FALSE(made);
    expect_error(made.error(), Errc::invalid_argument, "RANK=\"zero\" is not an integer");
  }
  {
    ScopedEnv a("SLURM_PROCID", "0"), b("SLURM_NTASKS", "1"), c("MASTER_ADDR", nullptr);
    auto made = Communicator::create(o);
    ASSERT_FALSE(made);
    expect_error(made.error(), Errc::invalid_argument, "MASTER_ADDR is not set");
  }
  {
    ScopedEnv a("RANK", "0"), b("WORLD_SIZE", "1"), c("MASTER_ADDR", "127.0.0.1"),
        d("MASTER_PORT", "99999");
    auto made = Communicator::create(o);
    ASSERT_FALSE(made);
    expect_error(made.error(), Errc::invalid_argument, "MASTER_PORT: port \"99999\"");
  }
  {
    // Slurm's variables stand in for torchrun's, and the rank comes out.
    ScopedEnv a("SLURM_PROCID", "0"), b("SLURM_NTASKS", "1"), c("SLURM_LOCALID", "0");
    CommOptions f = single();
    f.rank.reset();
    f.world_size.reset();
    auto made = Communicator::create(f);
    ASSERT_TRUE(made) << made.error().to_string();
    EXPECT_EQ(made.value().rank(), 0);
    EXPECT_EQ(made.value().size(), 1);
    EXPECT_EQ(made.value().local_rank(), 0);
  }
}

TEST(CommSingleRank, CollectivesOfOneRankAreIdentitiesAndBadArgumentsAreNamed) {
  auto made = Communicator::create(single());
  ASSERT_TRUE(made) << made.error().to_string();
  Communicator comm = made.value();
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.generation(), 0);
  EXPECT_FALSE(comm.dispatch_info().adapter.empty());

  at::Tensor t = at::arange(6, at::kFloat);
  ASSERT_TRUE(comm.all_reduce(t, ReduceOp::avg));
  EXPECT_TRUE(at::equal(t, at::arange(6, at::kFloat)));
  at::Tensor out = at::empty({6});
  ASSERT_TRUE(comm.all_gather(out, t));
  EXPECT_TRUE(at::equal(out, t));
  ASSERT_TRUE(comm.barrier());

  at::Tensor i = at::ones({3}, at::kLong);
  expect_error(comm.all_reduce(i, ReduceOp::avg).error(), Errc::invalid_argument,
               "op: avg needs a floating dtype, got int64");
  at::Tensor strided = at::ones({4, 4}).t();
  expect_error(comm.all_reduce(strided).error(), Errc::invalid_argument,
               "tensor: must be contiguous");
  at::Tensor undefined;
  expect_error(comm.all_reduce(undefined).error(), Errc::invalid_argument,
               "tensor: undefined tensor");
  at::Tensor wrong = at::empty({5});
  expect_error(comm.all_gather(wrong, t).error(), Errc::invalid_argument,
               "output: expected [6] (size() * input.size(0) rows), got [5]");
  at::Tensor half = at::empty({6}, at::kHalf);
  expect_error(comm.all_gather(half, t).error(), Errc::invalid_argument,
               "output: dtype float16 differs from input's float32");
  std::vector<at::Tensor> list{at::empty({6}), at::empty({6})};
  expect_error(comm.all_gather(list, t).error(), Errc::invalid_argument,
               "outputs: expected 1 tensors (one per rank), got 2");
  expect_error(comm.reduce_scatter(t, wrong).error(), Errc::invalid_argument,
               "input: expected [6] (size() * output.size(0) rows), got [5]");
  expect_error(comm.broadcast(t, 1).error(), Errc::invalid_argument, "root: expected in [0, 1)");
  expect_error(comm.send(t, 0).error(), Errc::invalid_argument, "peer: 0 is this rank");
  expect_error(comm.recv(t, 3).error(), Errc::invalid_argument, "peer: expected in [0, 1)");
  at::Tensor a2a_out = at::empty({6});
  expect_error(comm.all_to_all(a2a_out, t, {6, 1}, {6}).error(), Errc::invalid_argument,
               "output_splits: expected 1 sizes");
  expect_error(comm.all_to_all(a2a_out, t, {5}, {6}).error(), Errc::invalid_argument,
               "output_splits: sums to 5 rows, but output has 6");
  expect_error(comm.all_to_all(a2a_out, t, {6}, {-1}).error(), Errc::invalid_argument,
               "input_splits[0]: negative");
  keel::comm::CallOptions call;
  call.timeout = std::chrono::milliseconds(-5);
  expect_error(comm.all_reduce(t, ReduceOp::sum, call).error(), Errc::invalid_argument,
               "timeout: expected > 0 ms");
  expect_error(comm.split({0, 0}, "x").error(), Errc::invalid_argument, "appears twice");
  expect_error(comm.split({1}, "x").error(), Errc::invalid_argument, "is not in [0, 1)");
  expect_error(comm.split({0}, "a/b").error(), Errc::invalid_argument, "name: expected");
  expect_error(keel::comm::Work().wait().error(), Errc::invalid_argument, "an empty Work");

  // A bad call does not abort: the group still works.
  ASSERT_TRUE(comm.all_reduce(t));
  EXPECT_FALSE(comm.is_aborted());

  const std::string trace = comm.flight_recorder_json();
  EXPECT_NE(trace.find("\"op\": \"all_gather\""), std::string::npos) << trace;
  EXPECT_NE(trace.find("\"state\": \"completed\""), std::string::npos) << trace;
  auto bad_path = comm.dump_flight_recorder("/nonexistent-dir/trace.json");
  ASSERT_FALSE(bad_path);
  EXPECT_EQ(bad_path.error().code(), Errc::io_error);

  comm.abort();
  EXPECT_TRUE(comm.is_aborted());
  expect_error(comm.all_reduce(t).error(), Errc::aborted, "abort() was called");
}

// Rejoining needs a store that outlived the rank it replaces, and a world
// that re-forms with the replacement in time; a grown-back reform of a
// world whose every rank is alive keeps its size and numbering.
TEST(CommRejoin, BadRejoinsAreNamedAndAFullWorldReformsWhole) {
  CommOptions host = single();
  host.rendezvous = "tcp://127.0.0.1:29999";
  host.rejoin = true;
  auto rank0 = Communicator::create(host);
  ASSERT_FALSE(rank0);
  expect_error(rank0.error(), Errc::invalid_argument, "rank 0 hosted the store");

  CommOptions lonely = single();
  lonely.rejoin = true;
  lonely.timeout = std::chrono::milliseconds(300);
  const auto t0 = std::chrono::steady_clock::now();
  auto nobody = Communicator::create(lonely);
  ASSERT_FALSE(nobody);
  expect_error(nobody.error(), Errc::timeout, "could not rejoin 'world'");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1300));

  auto made = Communicator::create(single());
  ASSERT_TRUE(made) << made.error().to_string();
  keel::comm::ReformOptions grow;
  grow.wait_for_replacements = true;
  auto again = made.value().reform(grow);
  ASSERT_TRUE(again) << again.error().to_string();
  EXPECT_EQ(again.value().generation(), 1);
  EXPECT_EQ(again.value().size(), 1);
  at::Tensor t = at::full({3}, 2.0);
  ASSERT_TRUE(again.value().all_reduce(t));
  EXPECT_TRUE(at::equal(t, at::full({3}, 2.0)));
}

// Exits 0 when, after a Communicator was created, a writev to a socket
// whose peer is gone fails with EPIPE (what gloo does to a dead peer); if
// SIGPIPE still had its default action the process dies of it instead.
void write_to_dead_peer_after_create() {
  ::signal(SIGPIPE, SIG_DFL);
  if (!Communicator::create(single())) std::_Exit(3);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::_Exit(4);
  ::close(fds[1]);
  char byte = 0;
  iovec iov{&byte, 1};
  const ssize_t written = ::writev(fds[0], &iov, 1);
  std::_Exit(written == -1 && errno == EPIPE ? 0 : 5);
}

void application_sigpipe_handler(int /*signal*/) {}

// Exits 0 when an application's own SIGPIPE handler survives create.
void keep_application_sigpipe_handler() {
  struct sigaction handler {};
  handler.sa_handler = application_sigpipe_handler;
  sigemptyset(&handler.sa_mask);
  ::sigaction(SIGPIPE, &handler, nullptr);
  if (!Communicator::create(single())) std::_Exit(3);
  struct sigaction now {};
  ::sigaction(SIGPIPE, nullptr, &now);
  std::_Exit(now.sa_handler == application_sigpipe_handler ? 0 : 6);
}

// Each in a fresh process (gtest re-runs the binary for the test alone), so
// that the once-per-process setting starts from the state the test makes.
TEST(CommSigpipe, AWriteToADeadPeerFailsInsteadOfKillingTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(write_to_dead_peer_after_create(), ::testing::ExitedWithCode(0), "");
}

TEST(CommSigpipe, AnApplicationsOwnHandlerIsKept) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(keep_application_sigpipe_handler(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
