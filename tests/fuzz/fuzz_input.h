// What keel's fuzz targets share: tensors and option values drawn from the
// fuzzer's bytes. Shapes stay tiny (every dimension below 10, a few hundred
// elements at most), so an input costs microseconds and the fuzzer explores
// validation and dispatch rather than arithmetic; dtypes, devices, layouts
// (non-contiguous, expanded, undefined) and values are all fair game.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fuzzer/FuzzedDataProvider.h>

#include "keel/v1/dispatch.h"

namespace keel::fuzz {

// A dimension: usually small, sometimes 0.
inline std::int64_t dim(FuzzedDataProvider& in) {
  return in.ConsumeIntegralInRange<std::int64_t>(0, 9);
}

// An integer parameter: small values most of the time, extremes sometimes.
inline std::int64_t parameter(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      return std::numeric_limits<std::int64_t>::max();
    case 1:
      return std::numeric_limits<std::int64_t>::min();
    case 2:
      return in.ConsumeIntegral<std::int64_t>();
    default:
      return in.ConsumeIntegralInRange<std::int64_t>(-3, 300);
  }
}

// A double option: ordinary values, and NaN, infinities, negatives.
inline double real(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0:
      return std::numeric_limits<double>::quiet_NaN();
    case 1:
      return std::numeric_limits<double>::infinity();
    case 2:
      return -std::numeric_limits<double>::infinity();
    case 3:
      return 0.0;
    default:
      return in.ConsumeFloatingPointInRange<double>(-4.0, 4.0);
  }
}

inline at::ScalarType dtype(FuzzedDataProvider& in) {
  static constexpr at::ScalarType kTypes[] = {
      at::kFloat, at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
      at::kLong,  at::kInt,   at::kBool,   at::kByte, at::kComplexFloat};
  return kTypes[in.ConsumeIntegralInRange<std::size_t>(0, std::size(kTypes) - 1)];
}

inline keel::Backend backend(FuzzedDataProvider& in) {
  // Any byte: the enum's own values and some that are not.
  return static_cast<keel::Backend>(in.ConsumeIntegralInRange<std::uint8_t>(0, 4));
}

// Values for a tensor of `dtype`: integers in [lo, hi] for integer and bool
// types, normal floats otherwise (with an occasional NaN or infinity).
inline at::Tensor values(FuzzedDataProvider& in, at::IntArrayRef shape, at::ScalarType type,
                         std::int64_t lo = -2, std::int64_t hi = 9) {
  const std::int64_t numel = c10::multiply_integers(shape);
  std::vector<double> v(static_cast<std::size_t>(numel));
  for (double& x : v) {
    if (at::isFloatingType(type) || at::isComplexType(type)) {
      const int pick = in.ConsumeIntegralInRange<int>(0, 40);
      x = pick == 0   ? std::numeric_limits<double>::quiet_NaN()
          : pick == 1 ? std::numeric_limits<double>::infinity()
                      : in.ConsumeFloatingPointInRange<double>(-3.0, 3.0);
    } else {
      x = static_cast<double>(in.ConsumeIntegralInRange<std::int64_t>(lo, hi));
    }
  }
  return at::tensor(v, at::kDouble).view(shape).to(type);
}

// A tensor of roughly `shape`: sometimes a wrong rank or size, a
// non-contiguous or expanded layout, the meta device, or undefined.
inline at::Tensor tensor(FuzzedDataProvider& in, std::vector<std::int64_t> shape,
                         at::ScalarType type, std::int64_t lo = -2, std::int64_t hi = 9) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      return {};
    case 1:
      if (!shape.empty()) shape.pop_back();
      break;
    case 2:
      shape.push_back(dim(in));
      break;
    case 3:
      if (!shape.empty())
        shape[in.ConsumeIntegralInRange<std::size_t>(0, shape.size() - 1)] = dim(in);
      break;
    default:
      break;
  }
  const int layout = in.ConsumeIntegralInRange<int>(0, 7);
  if (layout == 0) return at::empty(shape, at::TensorOptions(type).device(at::kMeta));
  if (layout == 1 && !shape.empty() && shape.back() > 0) {
    // Expanded: stride 0 along the last dimension.
    std::vector<std::int64_t> one = shape;
    one.back() = 1;
    return values(in, one, type, lo, hi).expand(shape);
  }
  if (layout == 2 && shape.size() >= 2) {
    // Non-contiguous: the last two dimensions made transposed.
    std::vector<std::int64_t> swapped = shape;
    std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
    return values(in, swapped, type, lo, hi).transpose(-1, -2);
  }
  return values(in, shape, type, lo, hi);
}

}  // namespace keel::fuzz
