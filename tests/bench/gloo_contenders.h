// The two contenders of keel's communication benchmarks (keel_comm_bench,
// keel_peer_bench comm), made the same way for both: a keel::comm world and
// a raw c10d::ProcessGroupGloo as a c10d user builds it, each on its own
// TCP store on loopback (`port` for keel, `port + 1` for the raw group).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "keel/v1/comm.h"

namespace keel::testing {

// keel's world of `world` ranks; nullopt (after printing why) on failure.
inline std::optional<keel::comm::Communicator> keel_world(int rank, int world, int port) {
  keel::comm::CommOptions o;
  o.rendezvous = "tcp://127.0.0.1:" + std::to_string(port);
  o.rank = rank;
  o.world_size = world;
  o.timeout = std::chrono::seconds(120);
  auto made = keel::comm::Communicator::create(o);
  if (!made) {
    std::fprintf(stderr, "rank %d: %s\n", rank, made.error().to_string().c_str());
    return std::nullopt;
  }
  return made.value();
}

// The raw group; `threads` 0 keeps Gloo's default.
inline c10::intrusive_ptr<c10d::ProcessGroupGloo> raw_gloo_world(int rank, int world, int port,
                                                                 int threads = 0) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(port + 1);
  so.isServer = rank == 0;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(120);
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  auto go = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(120));
  go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  if (threads > 0) go->threads = threads;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("raw", store), rank, world, go);
}

}  // namespace keel::testing
