// keel's side of the peer comparison (tests/bench/peers/, docs/benchmarks.md
// "Side by side with the peers"): a driver that the Python orchestrators run
// so that keel and the Python peers (FlexAttention, PyTorch 2.13's
// linear_cross_entropy, torch.distributed) alternate in one run. Built with
// the tests, never run by ctest.
//
//   keel_peer_bench serve
//       Reads one request a line on stdin, answers one JSON line on stdout:
//         attention MASK L DTYPE PASS H     MASK causal|window256|window1024|documents,
//                                           DTYPE float32|bfloat16, PASS fwd|fwd_bwd
//         loss N D V [BUDGET]               forward+backward, float32; BUDGET sets
//                                           LinearCrossEntropyOptions::chunk_budget_bytes
//       Inputs are made at a configuration's first request and kept, so a
//       request times only the call (the orchestrator sends one untimed
//       warm-up request first). Answer: {"ms": wall milliseconds, "checksum":
//       the sum of the attention output, after the timing}.
//   keel_peer_bench loss-memory N D V [BUDGET]
//       One forward+backward in a fresh process: peak resident memory above
//       the resident memory once the inputs exist, the same measure the
//       orchestrator takes of every Python contender ({"peak_bytes", "ms"}).
//   keel_peer_bench comm --rank R --world N --port P --sizes a,b,.. --order keel|raw
//                        [--pairs K]
//       All-reduce of float32 tensors through keel::comm::Communicator and
//       through a raw c10d::ProcessGroupGloo built by hand, both on loopback:
//       per size, K (8) pairs of short blocks, keel and raw in turn (ABBA,
//       starting with --order); rank 0 prints one JSON line per size with
//       the seconds per operation of each block of each contender.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "gloo_contenders.h"
#include "keel/keel.h"
#include "keel/v1/comm.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The same document lengths as tests/bench/gpu_bench.cpp and the Python side.
const std::vector<std::int64_t> kDocumentPattern = {2048, 512, 1024, 256, 1536, 768, 2048, 1000};

at::Tensor document_ids(std::int64_t length) {
  std::vector<std::int64_t> ids;
  ids.reserve(static_cast<size_t>(length));
  std::int64_t doc = 0;
  while (static_cast<std::int64_t>(ids.size()) < length) {
    const std::int64_t n =
        std::min(kDocumentPattern[static_cast<size_t>(doc) % kDocumentPattern.size()],
                 length - static_cast<std::int64_t>(ids.size()));
    ids.insert(ids.end(), static_cast<size_t>(n), doc);
    ++doc;
  }
  return at::tensor(ids, at::kLong).view({1, length});
}

keel::AttentionSpec attention_spec(const std::string& mask, std::int64_t length) {
  keel::AttentionSpec spec;
  if (mask == "causal") {
    spec.masks = {keel::Mask::causal()};
  } else if (mask == "window256") {
    spec.masks = {keel::Mask::sliding_window(256, 0)};
  } else if (mask == "window1024") {
    spec.masks = {keel::Mask::sliding_window(1024, 0)};
  } else if (mask == "documents") {
    const at::Tensor ids = document_ids(length);
    spec.masks = {keel::Mask::causal(), keel::Mask::document(ids, ids)};
  } else {
    throw std::runtime_error("unknown mask " + mask);
  }
  return spec;
}

struct AttentionCase {
  keel::AttentionSpec spec;
  at::Tensor q, k, v;
};

struct LossCase {
  at::Tensor hidden, weight, target;
};

LossCase loss_inputs(std::int64_t n, std::int64_t d, std::int64_t v) {
  at::manual_seed(0);
  LossCase c;
  c.hidden = at::randn({n, d}).requires_grad_(true);
  c.weight = (at::randn({v, d}) * 0.05).requires_grad_(true);
  c.target = at::randint(0, v, {n}, at::kLong);
  return c;
}

void loss_step(const LossCase& c, std::int64_t budget) {
  keel::LinearCrossEntropyOptions options;
  options.chunk_budget_bytes = budget;  // 0: keel's automatic budget
  at::Tensor loss = keel::linear_cross_entropy(c.hidden, c.weight, c.target, options).value().loss;
  loss.backward();
  c.hidden.mutable_grad() = at::Tensor();
  c.weight.mutable_grad() = at::Tensor();
}

int serve() {
  std::map<std::string, AttentionCase> attention_cases;
  std::map<std::string, LossCase> loss_cases;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string what;
    in >> what;
    try {
      double ms = 0;
      double checksum = 0;  // sum of the output, to check that the peers agree
      if (what == "attention") {
        std::string mask, dtype, pass;
        std::int64_t length = 0, heads = 0;
        in >> mask >> length >> dtype >> pass >> heads;
        const bool backward = pass == "fwd_bwd";
        const std::string key = line;
        auto it = attention_cases.find(key);
        if (it == attention_cases.end()) {
          at::manual_seed(0);
          const auto type = dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;
          AttentionCase c;
          c.spec = attention_spec(mask, length);
          c.q = at::randn({1, heads, length, 64}).to(type).requires_grad_(backward);
          c.k = at::randn({1, heads, length, 64}).to(type).requires_grad_(backward);
          c.v = at::randn({1, heads, length, 64}).to(type).requires_grad_(backward);
          it = attention_cases.emplace(key, std::move(c)).first;
        }
        const AttentionCase& c = it->second;
        const auto t0 = Clock::now();
        at::Tensor out = keel::attention(c.q, c.k, c.v, c.spec).value().out;
        if (backward) {
          torch::autograd::grad({out}, {c.q, c.k, c.v}, {at::ones_like(out)});
        }
        ms = ms_since(t0);
        checksum = out.to(at::kDouble).sum().item<double>();
      } else if (what == "loss") {
        std::int64_t n = 0, d = 0, v = 0, budget = 0;
        in >> n >> d >> v;
        if (!(in >> budget)) budget = 0;
        const std::string key =
            std::to_string(n) + "x" + std::to_string(d) + "x" + std::to_string(v);
        auto it = loss_cases.find(key);
        if (it == loss_cases.end()) it = loss_cases.emplace(key, loss_inputs(n, d, v)).first;
        const auto t0 = Clock::now();
        loss_step(it->second, budget);
        ms = ms_since(t0);
      } else if (what == "drop") {  // frees every cached input
        attention_cases.clear();
        loss_cases.clear();
      } else {
        throw std::runtime_error("unknown request '" + line + "'");
      }
      std::printf("{\"ms\": %.4f, \"checksum\": %.9g}\n", ms, checksum);
    } catch (const std::exception& e) {
      std::string message = e.what();
      std::replace(message.begin(), message.end(), '"', '\'');
      std::replace(message.begin(), message.end(), '\n', ' ');
      std::printf("{\"error\": \"%s\"}\n", message.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

std::int64_t status_kib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(status, line)) {
    if (line.rfind(prefix, 0) == 0) return std::atoll(line.c_str() + prefix.size());
  }
  return -1;
}

int loss_memory(std::int64_t n, std::int64_t d, std::int64_t v, std::int64_t budget) {
  const LossCase c = loss_inputs(n, d, v);
  // Writing 5 to clear_refs resets VmHWM to the current resident size, so
  // what input construction held transiently is not counted.
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const std::int64_t base = status_kib("VmRSS");
  const auto t0 = Clock::now();
  loss_step(c, budget);
  const double ms = ms_since(t0);
  const std::int64_t hwm = status_kib("VmHWM");
  std::printf("{\"peak_bytes\": %lld, \"base_bytes\": %lld, \"ms\": %.1f}\n",
              static_cast<long long>((hwm - base) * 1024), static_cast<long long>(base * 1024), ms);
  return 0;
}

int comm(int rank, int world, int port, const std::vector<std::int64_t>& sizes,
         const std::string& order, int pairs) {
  auto made = keel::testing::keel_world(rank, world, port);
  if (!made) return 1;
  keel::comm::Communicator communicator = *made;
  // The raw contender: ProcessGroupGloo as a c10d user builds it.
  auto raw = keel::testing::raw_gloo_world(rank, world, port);

  for (const std::int64_t bytes : sizes) {
    at::Tensor t = at::ones({bytes / 4});
    std::vector<at::Tensor> tensors{t};
    // Short blocks, keel and raw in turn (ABBA), so that the load of the
    // moment falls on both members of a pair: about 32 MiB moved per block,
    // 1 to 50 operations (single operations vary 0.2-4x here); `pairs`
    // pairs in all.
    const int iterations =
        static_cast<int>(std::min<std::int64_t>(50, std::max<std::int64_t>(1, (32 << 20) / bytes)));
    const auto time_keel = [&] {
      const auto t0 = Clock::now();
      for (int i = 0; i < iterations; ++i) (void)communicator.all_reduce(t);
      return ms_since(t0) / 1e3 / iterations;
    };
    const auto time_raw = [&] {
      const auto t0 = Clock::now();
      for (int i = 0; i < iterations; ++i) raw->allreduce(tensors)->wait();
      return ms_since(t0) / 1e3 / iterations;
    };
    // Warm-up, then one barrier: the pairs run back to back.
    (void)communicator.all_reduce(t);
    raw->allreduce(tensors)->wait();
    (void)communicator.barrier();
    std::vector<double> keel_s(static_cast<std::size_t>(pairs));
    std::vector<double> raw_s(static_cast<std::size_t>(pairs));
    for (int p = 0; p < pairs; ++p) {
      const auto i = static_cast<std::size_t>(p);
      if ((p % 2 == 0) == (order == "keel")) {
        keel_s[i] = time_keel();
        raw_s[i] = time_raw();
      } else {
        raw_s[i] = time_raw();
        keel_s[i] = time_keel();
      }
    }
    if (rank == 0) {
      const auto list = [](const std::vector<double>& v) {
        std::string out;
        char number[32];
        for (const double x : v) {
          std::snprintf(number, sizeof number, "%.9f", x);
          out += (out.empty() ? "" : ", ") + std::string(number);
        }
        return out;
      };
      std::printf("{\"bytes\": %lld, \"iterations\": %d, \"keel_s\": [%s], \"raw_s\": [%s]}\n",
                  static_cast<long long>(bytes), iterations, list(keel_s).c_str(),
                  list(raw_s).c_str());
      std::fflush(stdout);
    }
  }
  (void)communicator.barrier();
  raw->barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 1 && args[0] == "serve") return serve();
    if ((args.size() == 4 || args.size() == 5) && args[0] == "loss-memory") {
      return loss_memory(std::atoll(args[1].c_str()), std::atoll(args[2].c_str()),
                         std::atoll(args[3].c_str()),
                         args.size() == 5 ? std::atoll(args[4].c_str()) : 0);
    }
    if (!args.empty() && args[0] == "comm") {
      int rank = -1, world = 0, port = 0;
      std::vector<std::int64_t> sizes;
      std::string order = "keel";
      int pairs = 8;
      for (size_t i = 1; i + 1 < args.size(); i += 2) {
        if (args[i] == "--rank") rank = std::atoi(args[i + 1].c_str());
        if (args[i] == "--world") world = std::atoi(args[i + 1].c_str());
        if (args[i] == "--port") port = std::atoi(args[i + 1].c_str());
        if (args[i] == "--order") order = args[i + 1];
        if (args[i] == "--pairs") pairs = std::atoi(args[i + 1].c_str());
        if (args[i] == "--sizes") {
          std::stringstream list(args[i + 1]);
          std::string item;
          while (std::getline(list, item, ',')) sizes.push_back(std::atoll(item.c_str()));
        }
      }
      if (rank >= 0 && world >= 2 && port > 0 && !sizes.empty() && pairs > 0) {
        return comm(rank, world, port, sizes, order, pairs);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel_peer_bench: %s\n", e.what());
    return 1;
  }
  std::fprintf(
      stderr,
      "usage: keel_peer_bench serve | loss-memory N D V [BUDGET] | comm --rank R --world N "
      "--port P --sizes B,.. --order keel|raw [--pairs K]\n");
  return 2;
}
