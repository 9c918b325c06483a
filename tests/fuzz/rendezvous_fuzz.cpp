// Fuzz target: the Communicator's rendezvous plan (the rendezvous URL, rank
// and world size from the options, torchrun's, Slurm's and torchelastic's
// environment variables) and the parsing of KEEL_BACKEND's values. Nothing
// here opens a socket: plan_rendezvous only reads and checks. A plan it
// accepts must be coherent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <fuzzer/FuzzedDataProvider.h>

#include "comm/rendezvous.h"
#include "keel/v1/comm.h"
#include "keel/v1/dispatch.h"

namespace {

constexpr const char* kVariables[] = {"MASTER_ADDR",
                                      "MASTER_PORT",
                                      "RANK",
                                      "WORLD_SIZE",
                                      "LOCAL_RANK",
                                      "LOCAL_WORLD_SIZE",
                                      "SLURM_PROCID",
                                      "SLURM_NTASKS",
                                      "SLURM_LOCALID",
                                      "SLURM_LAUNCH_NODE_IPADDR",
                                      "TORCHELASTIC_USE_AGENT_STORE",
                                      "TORCHELASTIC_RESTART_COUNT"};

// A value that looks like what the variable holds, or arbitrary text.
std::string value(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
      return std::to_string(in.ConsumeIntegralInRange<int>(-2, 70000));
    case 1:
      return std::to_string(in.ConsumeIntegral<std::int64_t>());
    case 2:
      return in.ConsumeBool() ? "127.0.0.1" : "True";
    default:
      return in.ConsumeRandomLengthString(24);
  }
}

std::string url(FuzzedDataProvider& in) {
  static constexpr const char* kSchemes[] = {"env://", "tcp://", "file://", "tcp://[", ""};
  std::string u = kSchemes[in.ConsumeIntegralInRange<std::size_t>(0, std::size(kSchemes) - 1)];
  return u + in.ConsumeRandomLengthString(40);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  for (const char* name : kVariables) {
    if (in.ConsumeBool()) {
      ::setenv(name, value(in).c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  keel::comm::CommOptions o;
  o.rendezvous = url(in);
  if (in.ConsumeBool()) o.rank = in.ConsumeIntegralInRange<int>(-3, 9);
  if (in.ConsumeBool()) o.world_size = in.ConsumeIntegralInRange<int>(-3, 9);
  if (in.ConsumeBool()) o.generation = in.ConsumeIntegral<int>();
  const auto plan = keel::internal::comm_detail::plan_rendezvous(o);
  if (plan) {
    const auto& p = plan.value();
    if (p.world_size < 1 || p.rank < 0 || p.rank >= p.world_size) __builtin_trap();
    if (p.kind == keel::internal::comm_detail::RendezvousPlan::Kind::tcp &&
        (p.port < 1 || p.port > 65535 || p.host.empty())) {
      __builtin_trap();
    }
  } else if (plan.error().code() != keel::Errc::invalid_argument ||
             plan.error().message().empty()) {
    __builtin_trap();
  }
  const auto backend = keel::parse_backend(in.ConsumeRemainingBytesAsString());
  if (!backend && backend.error().code() != keel::Errc::invalid_argument) __builtin_trap();
  return 0;
}
