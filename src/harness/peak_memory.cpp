#include "harness/peak_memory.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace keel::harness {
namespace {

std::atomic<std::int64_t> live{0};
std::atomic<std::int64_t> peak{0};

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* context = new Context{std::move(inner), static_cast<std::int64_t>(n)};
    const std::int64_t now = live.fetch_add(context->bytes) + context->bytes;
    std::int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    return {data, context, &release, device};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  struct Context {
    c10::DataPtr inner;
    std::int64_t bytes;
  };
  static void release(void* raw) {
    auto* context = static_cast<Context*>(raw);
    live.fetch_sub(context->bytes);
    delete context;
  }

  c10::Allocator* base_;
};

void install_once() {
  static const bool installed = [] {
    // Never destroyed: tensors freed during static destruction still call it.
    static auto* allocator = new CountingAllocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(allocator, std::numeric_limits<uint8_t>::max());
    return true;
  }();
  (void)installed;
}

}  // namespace

PeakMemory::PeakMemory() {
  install_once();
  baseline_ = live.load();
  peak.store(baseline_);
}

std::int64_t PeakMemory::peak_bytes() const {
  return std::max<std::int64_t>(0, peak.load() - baseline_);
}

}  // namespace keel::harness
