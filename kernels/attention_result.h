// What keel's attention kernels return (block-sparse, decode, paged): the
// output, its log-sum-exp, and how much of the problem they read. Its own
// header, so that no kernel includes another for its result type.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace keel::kernels {

struct AttentionOutput {
  at::Tensor out;  // [B, Hq, Lq, Ev], q's dtype
  at::Tensor lse;  // [B, Hq, Lq], float32 (float64 for float64 input)
  // The fraction of the problem read: block-sparse, blocks multiplied over the
  // (query, key) block pairs of the dense problem; decode and paged, keys read
  // over the cache's keys times the blocks of queries (each block reads again).
  double visible_fraction = 1.0;
  // Calls of libtorch's CPU flash kernel that block-sparse made, or -1 when
  // it counted none (its tile loop on plain ATen ops; the decode kernels).
  std::int64_t kernel_calls = -1;
};

}  // namespace keel::kernels
