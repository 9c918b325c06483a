// keel's kernel for attention against a KV cache, where the cost is reading
// the cache: decode (Lq <= kDecodeMaxQueries: one step, or speculative
// verification), chunked prefill (Lq < Lk), and paged caches. For each
// sequence it reads only the keys the mask leaves visible (a window, a
// key-padding length, a document), and each key/value head once for its
// whole group of query heads: the queries of a group are the rows of one
// head, for libtorch's CPU flash kernel over a view of the visible keys
// (masked there when not every query sees every key), or for keel's own
// matrix products where the flash kernel cannot serve (score modifiers,
// Ev != E, float64, a paged cache, an lse that autograd must reach), or,
// off the autograd graph where each query's keys are one interval (a
// document's too, when its keys are one run of equal ids), keel's fused
// kernel (fused_decode.h: pages, and up to 16 query rows per kv head of a
// float32 contiguous cache, or 32 over at most 1024 keys; 32 of a bfloat16
// one). The cache is never expanded or copied whole: keel's products read a
// narrow (16-bit) cache or pages through a bounded tile, the fused kernel
// reads rows where they lie. Differentiable through autograd on a
// contiguous cache; every score modifier and mask kind.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "block_sparse_attention.h"
#include "keel/v1/attention.h"

namespace keel::kernels {

// The most queries per sequence the decode kernel takes.
constexpr std::int64_t kDecodeMaxQueries = 16;

// The most queries of a chunked prefill (Lq < Lk) the kernel takes.
constexpr std::int64_t kPrefillMaxQueries = 1024;

// Whether the decode kernel serves this call: CPU tensors, Lk >= 1, and
// either 1 <= Lq <= kDecodeMaxQueries, or a chunked prefill (Lq < Lk, Lq <=
// kPrefillMaxQueries) that libtorch's CPU flash kernel can compute (no score
// modifier, Ev == E, not float64).
bool decode_serves(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const AttentionSpec& spec);

// q, k, v and spec as keel::attention validated them; `scale` resolved.
// `visible_fraction` is the fraction of the cache's keys read;
// `kernel_calls` stays -1 (no call of libtorch's flash kernel).
BlockSparseResult decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionSpec& spec, double scale);

// Sequence b of a paged call, as the contiguous call on its own `len` keys:
// the batch narrowed to b, and every key-indexed tensor (document ids,
// boolean mask, bias) narrowed from the table's `logical_len` keys to `len`.
AttentionSpec paged_sequence_spec(const AttentionSpec& spec, std::int64_t b, std::int64_t batch,
                                  std::int64_t len, std::int64_t logical_len);

// Attention against a paged cache (CPU, any Lq: queries go in blocks of
// kDecodeMaxQueries, each reading the visible keys of its sequence once):
// each sequence as the contiguous call on its own `lengths[b]` keys, its
// pages read where they lie through a bounded tile. Off the autograd graph
// (keel::attention refuses a paged call that autograd must reach).
BlockSparseResult paged_attention(const at::Tensor& q, const PagedKVCache& cache,
                                  const AttentionSpec& spec, double scale);

}  // namespace keel::kernels
