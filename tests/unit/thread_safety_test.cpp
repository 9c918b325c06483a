// Concurrent calls give what serial calls give: 8 threads call attention and
// the fused loss on their own inputs at once, and every result must equal,
// bitwise, the same call made alone on one thread.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "keel/keel.h"

namespace {

struct Inputs {
  at::Tensor q, k, v, hidden, weight, target;
};

Inputs make(int seed) {
  at::manual_seed(seed);
  Inputs in;
  in.q = at::randn({1, 2, 96, 16});
  in.k = at::randn({1, 2, 96, 16});
  in.v = at::randn({1, 2, 96, 16});
  in.hidden = at::randn({64, 32});
  in.weight = at::randn({300, 32});
  in.target = at::randint(0, 300, {64}, at::kLong);
  return in;
}

struct Outputs {
  at::Tensor attention, loss;
};

Outputs run(const Inputs& in) {
  keel::AttentionSpec spec;
  spec.masks = {keel::Mask::sliding_window(16, 0)};
  Outputs out;
  out.attention = keel::attention(in.q, in.k, in.v, spec).value().out;
  keel::LinearCrossEntropyOptions options;
  options.label_smoothing = 0.1;
  options.chunk_size = 16;
  out.loss = keel::linear_cross_entropy(in.hidden, in.weight, in.target, options).value().loss;
  return out;
}

TEST(ThreadSafety, EightThreadsGiveTheSerialResultsBitwise) {
  constexpr int kThreads = 8;
  std::vector<Inputs> inputs;
  std::vector<Outputs> serial;
  for (int t = 0; t < kThreads; ++t) {
    inputs.push_back(make(100 + t));
    serial.push_back(run(inputs.back()));
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<Outputs> concurrent(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] { concurrent[t] = run(inputs[t]); });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_TRUE(at::equal(concurrent[t].attention, serial[t].attention)) << "thread " << t;
      EXPECT_TRUE(at::equal(concurrent[t].loss, serial[t].loss)) << "thread " << t;
    }
  }
}

}  // namespace
