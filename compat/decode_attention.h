// keel's decode kernel: a few queries (Lq <= kDecodeMaxQueries: one decode
// step, or speculative verification) against a long key/value cache, where
// the cost is reading the cache, contiguous or paged. For each sequence it reads only the keys the
// mask leaves visible (a window, a key-padding length, a document), and each
// key/value head once for its whole group of query heads: the queries of a
// group are the rows of one matrix product with that head's keys, so
// grouped-query caches are never expanded and never copied (a narrow cache,
// bfloat16 or float16, is widened a bounded tile at a time). Plain ATen
// ops around keel's tile fill, differentiable through autograd on a
// contiguous cache; every score modifier and mask kind.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "block_sparse_attention.h"
#include "keel/v1/attention.h"

namespace keel::compat {

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

}  // namespace keel::compat
