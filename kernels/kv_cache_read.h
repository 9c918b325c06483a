// Reading one side of a KV cache (keys or values) where it lies, contiguous
// or paged, into keel's own products: a view where the cache is already in
// the compute dtype, else a bounded tile (kConvertElements), filled row by
// row and reused. The cache is never expanded or copied whole.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace keel::kernels {

// One side of the cache (keys or values) as the kernel reads it: a
// contiguous [B, Hkv, Lk, X] tensor, or a pool of pages [P, Hkv, page_size,
// X] and one sequence's page ids (key j is row j % page_size of page
// pages[j / page_size]).
struct CacheSide {
  const at::Tensor& t;
  const std::int64_t* pages = nullptr;
  std::int64_t page_size = 0;
};

// In `acc`, over keys [lo, lo + len) of sequences [b0, b0 + nb) of `side`:
//   scores (keys_are_columns): a [nb, Hkv, M, E] @ keys^T -> [nb, Hkv, M, len];
//   output:                    a [nb, Hkv, M, len] @ values -> [nb, Hkv, M, Ev].
// A contiguous cache in `acc` is one product over a view of it. Otherwise
// (pages, a narrow dtype) the keys go through a tile of about
// kConvertElements elements, filled where they lie and reused, never a copy
// of the whole range; a narrow cache that autograd must reach is converted
// by ATen, a slice at a time, on the graph.
at::Tensor cache_matmul(const at::Tensor& a, const CacheSide& side, std::int64_t b0,
                        std::int64_t nb, std::int64_t lo, std::int64_t len, bool keys_are_columns,
                        at::ScalarType acc);

}  // namespace keel::kernels
