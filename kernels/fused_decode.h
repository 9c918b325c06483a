// keel's fused decode kernel: a few queries per kv head against a KV cache
// (contiguous or paged), read once, where they lie, in their own dtype. One
// pass per (sequence, kv head, run of keys): the scores of a block of 16
// keys for every query row of the group, an online softmax, and the value
// rows weighted into an accumulator that stays in the core's cache; runs of
// keys merge by log-sum-exp. No ATen op runs in its arithmetic (no
// dispatch, no intermediate tensor; at two or more threads, one tensor of a
// byte per thread seats the workers on libtorch's team), which is what a
// decode step's cost is made of when the cache is small, and its reads are
// the cache's bytes, which is the cost when the cache is long.
//
// What it serves (decode_attention's caller checks): float32 or bfloat16
// q, k and v; no score modifier; every row's visible keys one interval; at
// most kFusedMaxRows query rows per kv head; off the autograd graph.
#pragma once

#include <cstdint>

#include <c10/core/ScalarType.h>

namespace keel::kernels {

// The most query rows (group size times queries) per kv head.
constexpr std::int64_t kFusedMaxRows = 32;

// Where the rows of one side of the cache (keys or values) lie, in elements
// of the cache's dtype. A contiguous cache: row j of head h of sequence s at
// base + s * outer_stride + h * head_stride + j * row_stride. A paged one:
// row j at page pages[j / page_size], with outer_stride between pages.
// Elements of a row are adjacent.
struct CacheRows {
  const void* base = nullptr;
  std::int64_t outer_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t row_stride = 0;
  const std::int64_t* pages = nullptr;
  std::int64_t page_size = 0;
};

// One call: queries [q0, q0 + rows) of sequences [b0, b0 + nb) of q (`[B, Hq,
// Lq, E]`, any strides, in elements) against sequences [c0, c0 + nb) of the
// cache (a paged cache: nb == 1, its pages). Query r sees keys [lo[r],
// hi[r]). Writes `out` `[nb, Hkv, group * rows, Ev]` and `lse` `[nb, Hkv,
// group * rows]`, float32, contiguous: row gi * rows + r of kv head h is
// query r of head h * group + gi (a row that sees no key: 0 and -inf).
struct FusedDecodeCall {
  c10::ScalarType dtype = c10::ScalarType::Float;  // of q, k and v
  const void* q = nullptr;
  std::int64_t q_strides[4] = {0, 0, 0, 0};
  CacheRows k;
  CacheRows v;
  std::int64_t b0 = 0, nb = 0, c0 = 0, q0 = 0, rows = 0;
  std::int64_t kv_heads = 0, group = 0, head_dim = 0, value_dim = 0;
  float scale = 1.0F;
  const std::int64_t* lo = nullptr;
  const std::int64_t* hi = nullptr;
  float* out = nullptr;
  float* lse = nullptr;
};

// Whether the kernel runs on this machine for these head dims: it is
// written for AVX-512 (F, BW, DQ, VL; the CPU is asked once) and takes head
// dims that are multiples of 16. Elsewhere keel's other routes serve.
bool fused_decode_runs_here(std::int64_t head_dim, std::int64_t value_dim);

// Runs `call` (fused_decode_runs_here for its head dims), split over
// ATen's intra-op threads by (sequence, kv head, run of keys).
void fused_decode(const FusedDecodeCall& call);

}  // namespace keel::kernels
