#include "convnn/bench/tracking_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

namespace convnn::bench {
namespace {

// c10::SetCPUAllocator only replaces an allocator registered with a lower or equal priority, and
// the stored priority cannot be read back; the highest one makes both install and restore succeed.
constexpr uint8_t kPriority = std::numeric_limits<uint8_t>::max();

}  // namespace

TrackingAllocator& TrackingAllocator::instance() {
  // Never destroyed: deleters of live tensors may run during static destruction.
  static auto* const tracker = new TrackingAllocator();
  return *tracker;
}

c10::DataPtr TrackingAllocator::allocate(size_t bytes) {
  c10::Allocator* inner;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    inner = inner_ != nullptr ? inner_ : c10::GetDefaultCPUAllocator();
  }
  c10::DataPtr allocation = inner->allocate(bytes);
  void* data = allocation.get();
  // Zero-byte requests may come back as nullptr; there is nothing to count or to key them by.
  if (data == nullptr) return allocation;
  const auto device = allocation.device();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, inserted] = live_.try_emplace(data, Allocation{std::move(allocation), bytes});
    if (!inserted) {
      // The address was freed behind our back (raw_deallocate after we were uninstalled) and has
      // been reused: forget the stale entry without freeing it again.
      current_ -= it->second.bytes;
      it->second.inner.release_context();
      it->second = Allocation{std::move(allocation), bytes};
    }
    current_ += bytes;
    peak_ = std::max(peak_, current_);
  }
  // Context == data keeps this a "simple" DataPtr, so raw_allocate and copy-on-write work.
  return {data, data, &TrackingAllocator::release, device};
}

void TrackingAllocator::release(void* data) {
  if (data == nullptr) return;  // raw_deallocate of a zero-byte raw_allocate
  auto& self = instance();
  c10::DataPtr inner;
  c10::DeleterFnPtr foreign = nullptr;
  {
    std::lock_guard<std::mutex> lock(self.mutex_);
    const auto it = self.live_.find(data);
    if (it != self.live_.end()) {
      self.current_ -= it->second.bytes;
      inner = std::move(it->second.inner);
      self.live_.erase(it);
    } else {
      // Not ours: raw memory allocated before we were installed and freed through
      // GetCPUAllocator()->raw_deallocate now (oneDNN's buffers go this way). It belongs to the
      // allocator we wrap.
      auto* owner = self.inner_ != nullptr ? self.inner_ : c10::GetDefaultCPUAllocator();
      foreign = owner->raw_deleter();
    }
  }
  TORCH_INTERNAL_ASSERT(foreign != nullptr || inner, "TrackingAllocator: cannot free unknown pointer ", data);
  if (foreign != nullptr) foreign(data);
  // Otherwise `inner` frees the memory here, outside the lock.
}

c10::DeleterFnPtr TrackingAllocator::raw_deleter() const { return &TrackingAllocator::release; }

void TrackingAllocator::copy_data(void* dest, const void* src, size_t count) const {
  default_copy_data(dest, src, count);
}

size_t TrackingAllocator::current_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

size_t TrackingAllocator::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

size_t TrackingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_ = current_;
  return current_;
}

ScopedTrackingAllocator::ScopedTrackingAllocator() : previous_(c10::GetCPUAllocator()) {
  auto& tracker = TrackingAllocator::instance();
  TORCH_CHECK(previous_ != &tracker, "ScopedTrackingAllocator: the tracking allocator is already installed");
  {
    std::lock_guard<std::mutex> lock(tracker.mutex_);
    tracker.inner_ = previous_;
  }
  c10::SetCPUAllocator(&tracker, kPriority);
  TORCH_CHECK(c10::GetCPUAllocator() == &tracker,
              "ScopedTrackingAllocator: c10::SetCPUAllocator did not install the tracking allocator");
}

ScopedTrackingAllocator::~ScopedTrackingAllocator() { c10::SetCPUAllocator(previous_, kPriority); }

PeakWindow::PeakWindow(TrackingAllocator& tracker)
    : tracker_(tracker), start_(tracker.reset_peak()) {}

size_t PeakWindow::peak_growth() const {
  const size_t peak = tracker_.peak_bytes();
  return peak > start_ ? peak - start_ : 0;
}

}  // namespace convnn::bench
