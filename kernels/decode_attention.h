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
// kernel (fused_decode.h; attention_route.h says which route serves each
// block of queries). The cache is never expanded or copied whole: keel's products read a
// narrow (16-bit) cache or pages through a bounded tile, the fused kernel
// reads rows where they lie. Differentiable through autograd on a
// contiguous cache; every score modifier and mask kind.
#pragma once

#include <ATen/core/Tensor.h>

#include "attention_result.h"
#include "keel/v1/attention.h"

namespace keel::kernels {

// q, k, v and spec as keel::attention validated them, a call that
// attention_kernel() gave to AttentionKernel::decode; `scale` resolved.
// `visible_fraction` is the fraction of the cache's keys read per block of
// queries; `kernel_calls` stays -1.
AttentionOutput decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const AttentionSpec& spec, double scale);

// Attention against a paged cache (CPU, any Lq: queries go in blocks, each
// reading the visible keys of its sequence once): each sequence as the
// contiguous call on its own `lengths[b]` keys, its pages read where they
// lie through a bounded tile. Off the autograd graph (keel::attention
// refuses a paged call that autograd must reach).
AttentionOutput paged_attention(const at::Tensor& q, const PagedKVCache& cache,
                                const AttentionSpec& spec, double scale);

}  // namespace keel::kernels
