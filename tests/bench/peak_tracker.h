// Peak c10 CPU memory of what one thread allocates while a PeakTracker is
// installed as its profiler state:
//   auto tracker = std::make_shared<PeakTracker>();
//   { c10::DebugInfoGuard g(c10::DebugInfoKind::PROFILER_STATE, tracker); step(); }
//   tracker->peak();
// c10's CPU allocator then reports every allocation and free it makes on
// this thread; scratch memory of the BLAS library is outside c10 and not
// counted.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

namespace keel::bench {

class PeakTracker final : public c10::MemoryReportingInfoBase {
 public:
  // alloc_size is negative for a free. c10's own running total is not used:
  // frees made while no tracker is installed never leave it.
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, size_t /*total_allocated*/,
                         size_t /*total_reserved*/, c10::Device /*device*/) override {
    current_ += alloc_size;
    peak_ = std::max(peak_, current_);
  }
  bool memoryProfilingEnabled() const override { return true; }
  double peak() const { return static_cast<double>(peak_); }

 private:
  int64_t current_ = 0;
  int64_t peak_ = 0;
};

}  // namespace keel::bench
