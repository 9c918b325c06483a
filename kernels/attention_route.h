// Every routing decision of keel's attention, in one room: which kernel
// serves a call (attention_kernel), and inside the decode kernel which route
// serves each block of queries (decode_routes, block_route) and how the
// flash kernel takes a block (flash_heads_layout, flash_splits). The
// thresholds are decode_policy.h's; the adapters and the decode kernel act
// on the answers and decide nothing themselves.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "keel/v1/attention.h"
#include "key_ranges.h"

namespace keel::kernels {

// The one layout rule of keel's attention kernels: they read a tensor with
// its last dimension at stride 1, and any strides elsewhere (a transposed
// [B, L, H, E] view, a slice of a fused QKV buffer, a storage offset, 0 for
// a broadcast dimension). A tensor whose last dimension is strided comes
// back as a contiguous copy, as at::scaled_dot_product_attention makes its
// inputs; autograd reaches the caller's tensor through the copy. Every route
// (dense, block-sparse, decode, paged, packed) reads its inputs through this.
at::Tensor kernel_layout(const at::Tensor& t);

// keel's attention kernels, as attention_kernel chooses among them.
enum class AttentionKernel {
  paged,           // paged_attention: a paged cache on the CPU, pages read where they lie
  gathered_paged,  // a paged cache elsewhere: each sequence gathered, then its own route
  decode,          // decode_attention: a few queries, or a chunk of prefill
  dense,           // sdpa_attention: a dense call SDPA computes exactly
  block_sparse,    // block_sparse_attention: the rest
};

struct KernelChoice {
  AttentionKernel kernel = AttentionKernel::block_sparse;
  // For block_sparse: why SDPA does not compute the call exactly, in a phrase.
  std::string refusal;
};

// The kernel for a call as keel::attention validated it. `paged`: k and v
// are the pools of a paged cache.
KernelChoice attention_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const AttentionSpec& spec, bool paged);

// Whether the block-sparse kernel runs its blocks on libtorch's CPU flash
// kernel (else on its tile loop of ATen ops): CPU tensors, Lq and Lk >= 1,
// no score modifier (the kernel adds only a mask), Ev == E. Its own autograd
// function carries the lse, so unlike the decode kernel's flash blocks, a
// call that returns the lse on the graph stays on the flash kernel.
bool block_sparse_on_flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionSpec& spec);

// The routes open to the sequences of a decode call that see the same keys
// (q, k and v as the kernel reads them: k and v the pools when paged).
struct DecodeRoutes {
  // The most visible keys (over the sequences of one block) for which keel's
  // fused kernel (fused_decode.h) serves the block; 0 when it serves none.
  std::int64_t fused_keys_most = 0;
  // libtorch's CPU flash kernel serves the blocks it is given.
  bool flash = false;
  // Queries per block: all of them for the fused kernel, kFlashQueryRows on
  // the flash kernel, kDecodeMaxQueries for keel's products (their scores
  // are materialised).
  std::int64_t block_rows = 1;
};
DecodeRoutes decode_routes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionSpec& spec, std::int64_t group, bool paged);

enum class BlockRoute {
  nothing_visible,  // no query of the block sees a key: output 0, lse -inf
  fused,            // keel's fused kernel
  flash,            // libtorch's CPU flash kernel over views of the cache
  products,         // keel's products through kv_cache_read.h
};

// The route of one block of queries of `sequences` sequences over `range`.
// `one_interval_per_query()` (asked only when the fused kernel could take
// the block) says whether each query's visible keys are one interval.
template <typename Intervals>
BlockRoute block_route(const DecodeRoutes& routes, std::int64_t sequences, const KeyRange& range,
                       Intervals&& one_interval_per_query) {
  if (range.hi <= range.lo) return BlockRoute::nothing_visible;
  if (routes.fused_keys_most > 0 && sequences * (range.hi - range.lo) <= routes.fused_keys_most &&
      one_interval_per_query()) {
    return BlockRoute::fused;
  }
  return routes.flash ? BlockRoute::flash : BlockRoute::products;
}

// Whether the flash kernel takes a block of `rows` queries per query head
// over `keys` keys in its own grouped-query layout (query heads against
// fewer kv heads) rather than as the rows of each kv head.
bool flash_heads_layout(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        std::int64_t group, std::int64_t rows, std::int64_t keys);

// Whether a block of a call of `q_len` queries splits `range` into its
// inner keys (no mask) and its masked edges, merged by log-sum-exp; `grad`:
// autograd must reach the inputs (the merge needs the lse on the graph,
// which libtorch's derivative of the kernel drops).
bool flash_splits(std::int64_t q_len, const KeyRange& range, bool grad);

}  // namespace keel::kernels
