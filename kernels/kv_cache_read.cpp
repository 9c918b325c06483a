#include "kv_cache_read.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "decode_policy.h"

namespace keel::kernels {

namespace {

// Rows of `x` elements of a cache in `D` (float or double): `rows` rows at
// `src`, `row_stride` apart, `elem_stride` between elements, into `dst`,
// one row after the other.
template <typename S, typename D>
void widen_rows(const S* src, std::int64_t row_stride, std::int64_t elem_stride, D* dst,
                std::int64_t rows, std::int64_t x) {
  for (std::int64_t r = 0; r < rows; ++r, src += row_stride, dst += x) {
    if (elem_stride == 1) {
      if constexpr (std::is_same_v<S, at::BFloat16> && std::is_same_v<D, float>) {
        // bfloat16 is the top half of a float32: a shift, which vectorises
        // (ATen's own conversion ran at about 1.3 GB/s here).
        const auto* bits = reinterpret_cast<const std::uint16_t*>(src);
        for (std::int64_t e = 0; e < x; ++e) {
          const std::uint32_t wide = static_cast<std::uint32_t>(bits[e]) << 16;
          std::memcpy(dst + e, &wide, sizeof wide);
        }
      } else {
        for (std::int64_t e = 0; e < x; ++e) dst[e] = static_cast<D>(src[e]);
      }
    } else {
      for (std::int64_t e = 0; e < x; ++e) dst[e] = static_cast<D>(src[e * elem_stride]);
    }
  }
}

// Keys [k0, k0 + n) of sequences [b0, b0 + nb) of `side` into `dst`, a
// contiguous [nb, Hkv, n, X] buffer of D: read where they lie (contiguous
// rows, or the rows of each page the sequence's table names).
template <typename S, typename D>
void fill_tile(const CacheSide& side, std::int64_t b0, std::int64_t nb, std::int64_t k0,
               std::int64_t n, D* dst) {
  const at::Tensor& t = side.t;
  const S* base = t.data_ptr<S>();
  const std::int64_t heads = t.size(1);
  const std::int64_t x = t.size(3);
  const std::int64_t s0 = t.stride(0);
  const std::int64_t s1 = t.stride(1);
  const std::int64_t s2 = t.stride(2);
  const std::int64_t s3 = t.stride(3);
  for (std::int64_t b = 0; b < nb; ++b) {
    for (std::int64_t h = 0; h < heads; ++h) {
      D* out = dst + (b * heads + h) * n * x;
      if (side.pages == nullptr) {
        widen_rows(base + (b0 + b) * s0 + h * s1 + k0 * s2, s2, s3, out, n, x);
        continue;
      }
      for (std::int64_t j = k0; j < k0 + n;) {
        const std::int64_t page = side.pages[j / side.page_size];
        const std::int64_t row = j % side.page_size;
        const std::int64_t m = std::min(side.page_size - row, k0 + n - j);
        widen_rows(base + page * s0 + h * s1 + row * s2, s2, s3, out + (j - k0) * x, m, x);
        j += m;
      }
    }
  }
}

void fill_tile(const CacheSide& side, std::int64_t b0, std::int64_t nb, std::int64_t k0,
               std::int64_t n, at::Tensor& dst) {
  const bool wide = dst.scalar_type() == at::kDouble;
  switch (side.t.scalar_type()) {
    case at::kDouble:
      return fill_tile<double>(side, b0, nb, k0, n, dst.data_ptr<double>());
    case at::kFloat:
      if (wide) return fill_tile<float>(side, b0, nb, k0, n, dst.data_ptr<double>());
      return fill_tile<float>(side, b0, nb, k0, n, dst.data_ptr<float>());
    case at::kBFloat16:
      return fill_tile<at::BFloat16>(side, b0, nb, k0, n, dst.data_ptr<float>());
    case at::kHalf:
      return fill_tile<at::Half>(side, b0, nb, k0, n, dst.data_ptr<float>());
    default:
      throw std::invalid_argument("cache_matmul: a cache of dtype " +
                                  std::string(c10::toString(side.t.scalar_type())));
  }
}

}  // namespace

at::Tensor cache_matmul(const at::Tensor& a, const CacheSide& side, std::int64_t b0,
                        std::int64_t nb, std::int64_t lo, std::int64_t len, bool keys_are_columns,
                        at::ScalarType acc) {
  const auto product = [&](const at::Tensor& x, const at::Tensor& c) {
    return at::matmul(x, keys_are_columns ? c.transpose(-1, -2) : c);
  };
  const std::int64_t heads = side.t.size(1);
  const std::int64_t x = side.t.size(3);
  if (side.pages == nullptr) {
    const at::Tensor view = side.t.narrow(0, b0, nb).narrow(2, lo, len);
    if (view.scalar_type() == acc) return product(a, view);
    if (view.numel() == 0) return product(a, view.to(acc));  // no elements to pace
  }
  // Autograd keeps the keys of each product for its backward: a tile that
  // is refilled cannot be those keys when any operand needs a gradient.
  const bool on_graph = side.pages == nullptr && at::GradMode::is_enabled() &&
                        (side.t.requires_grad() || a.requires_grad());
  const std::int64_t step =
      std::max<std::int64_t>(16, kConvertElements / std::max<std::int64_t>(1, nb * heads * x));
  at::Tensor tile;
  std::vector<at::Tensor> parts;
  at::Tensor sum;
  for (std::int64_t k0 = 0; k0 < len; k0 += step) {
    const std::int64_t n = std::min(step, len - k0);
    at::Tensor keys;
    if (on_graph) {
      keys = side.t.narrow(0, b0, nb).narrow(2, lo + k0, n).to(acc);
    } else {
      if (!tile.defined() || tile.size(2) != n)
        tile = at::empty({nb, heads, n, x}, a.options().dtype(acc));
      fill_tile(side, b0, nb, lo + k0, n, tile);
      keys = tile;
    }
    if (keys_are_columns) {
      parts.push_back(product(a, keys));  // the scores of these keys
    } else {
      const at::Tensor part = product(a.narrow(-1, k0, n), keys);  // their share of the output
      sum = sum.defined() ? sum + part : part;
    }
  }
  if (!keys_are_columns) return sum;
  return parts.size() == 1 ? parts[0] : at::cat(parts, -1);
}

}  // namespace keel::kernels
