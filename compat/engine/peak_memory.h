// Peak CPU tensor memory, measured rather than estimated: a counting
// allocator wraps libtorch's default CPU allocator (installed once, on first
// use, for the life of the process), and PeakMemory reads the high-water
// mark of live bytes since it was made.
#pragma once

#include <cstdint>

namespace keel::harness {

class PeakMemory {
 public:
  PeakMemory();
  // Bytes allocated at the peak since construction, above what was live then.
  std::int64_t peak_bytes() const;

 private:
  std::int64_t baseline_;
};

}  // namespace keel::harness
