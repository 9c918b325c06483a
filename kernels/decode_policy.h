// The thresholds of attention's routes against a KV cache: constants only,
// read by attention_route.cpp (which route serves) and by the decode kernel
// (how it cuts its work). The figures that set each one, measured on this
// project's CPU machines, are in docs/benchmarks.md ("The decode routes'
// thresholds"); change one only with a rerun of those figures.
#pragma once

#include <cstdint>

namespace keel::kernels {

// The most queries per sequence the decode kernel takes: a decode step, or a
// speculative verification of up to 15 tokens.
constexpr std::int64_t kDecodeMaxQueries = 16;

// The most queries of a chunked prefill (Lq < Lk) the decode kernel takes
// (on libtorch's flash kernel); a longer one is block-sparse's.
constexpr std::int64_t kPrefillMaxQueries = 1024;

// Queries per block on the flash kernel: bounds its additive mask to
// group * rows * keys elements.
constexpr std::int64_t kFlashQueryRows = 128;

// The granularity of the visible key range: key blocks of this many keys are
// classified from the mask spec, and the range read is the hull of the
// visible ones.
constexpr std::int64_t kKeyBlock = 256;

// Elements of a narrow (16-bit) cache or of pages converted to the compute
// dtype at a time: the only copy of the cache there is, a bounded one (1 MiB
// of float32, so that the product reads it from the core's cache).
constexpr std::int64_t kConvertElements = std::int64_t{256} * 1024;

// The flash kernel's grouped-query layout (query heads against fewer kv
// heads) serves a 16-bit block of fewer than kHeadsLayoutRows rows per kv
// head whose keys and values of one kv head fit kHeadsLayoutBytes (half of a
// 2 MiB L2 per core); otherwise the group's queries are the rows of one head.
constexpr std::int64_t kHeadsLayoutRows = 16;
constexpr std::int64_t kHeadsLayoutBytes = std::int64_t{1} << 20;

// A chunk of prefill (more than kDecodeMaxQueries queries) splits its range
// into unmasked inner keys and masked edges when the inner keys are at least
// this many times the masked ones.
constexpr std::int64_t kFlashSplitRatio = 4;

// The most query rows per kv head of a float32 contiguous cache that the
// fused kernel takes: past them keel's grouped products are as fast or
// faster, except over at most kFusedShortKeysF32 visible keys in one call.
// (A bfloat16 cache takes the fused kernel up to its kFusedMaxRows.)
constexpr std::int64_t kFusedContiguousRowsF32 = 16;
constexpr std::int64_t kFusedShortKeysF32 = 1024;

}  // namespace keel::kernels
