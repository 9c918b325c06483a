#include "peak_memory.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace keel::harness {
namespace {

std::atomic<std::int64_t> live{0};
std::atomic<std::int64_t> peak{0};

// Counts the bytes of every CPU allocation, passing each to the allocator
// it replaces. Its DataPtrs keep context == data, as the default CPU
// allocator's do: libtorch's raw_allocate() (used by some bfloat16 kernels)
// asserts exactly that, so the size and the real deleter live in a side
// table keyed by the pointer instead of in a context object.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;
    TORCH_INTERNAL_ASSERT(
        inner.get_context() == data,
        "keel::harness::PeakMemory needs a CPU allocator whose context is its data");
    const c10::DeleterFnPtr deleter = inner.get_deleter();
    (void)inner.release_context();
    const auto bytes = static_cast<std::int64_t>(n);
    {
      std::lock_guard<std::mutex> lock(mutex());
      table().emplace(data, Entry{bytes, deleter});
    }
    const std::int64_t now = live.fetch_add(bytes) + bytes;
    std::int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    return {data, data, &release, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  struct Entry {
    std::int64_t bytes;
    c10::DeleterFnPtr deleter;
  };
  // Leaked on purpose, like the allocator: tensors freed during static
  // destruction still come here.
  static std::mutex& mutex() {
    static auto* m = new std::mutex;
    return *m;
  }
  static std::unordered_map<void*, Entry>& table() {
    static auto* t = new std::unordered_map<void*, Entry>;
    return *t;
  }
  static void release(void* data) {
    Entry entry{};
    {
      std::lock_guard<std::mutex> lock(mutex());
      auto it = table().find(data);
      if (it == table().end()) return;
      entry = it->second;
      table().erase(it);
    }
    live.fetch_sub(entry.bytes);
    entry.deleter(data);
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
