#pragma once
// A CPU allocator that counts the bytes of ATen storage in use, for the peak-memory columns of
// `convnn bench`. It wraps the allocator that was installed before it and only adds bookkeeping.
#include <c10/core/Allocator.h>

#include <cstddef>
#include <mutex>
#include <unordered_map>

namespace convnn::bench {

/// Counts current and peak bytes of every allocation made through it. There is one instance per
/// process: a tensor allocated while it was installed may be freed long after it was uninstalled,
/// and its deleter (a plain function pointer) must still find the bookkeeping.
class TrackingAllocator final : public c10::Allocator {
 public:
  static TrackingAllocator& instance();

  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, size_t count) const override;

  /// Bytes handed out and not yet freed.
  size_t current_bytes() const;
  /// Largest current_bytes() since the last reset_peak().
  size_t peak_bytes() const;
  /// Starts a new window: peak := current. Returns current, read under the same lock.
  size_t reset_peak();

 private:
  friend class ScopedTrackingAllocator;
  TrackingAllocator() = default;
  static void release(void* data);

  struct Allocation {
    c10::DataPtr inner;  // frees the memory through the wrapped allocator when destroyed
    size_t bytes;
  };

  mutable std::mutex mutex_;
  c10::Allocator* inner_ = nullptr;  // the allocator being wrapped, set on install
  std::unordered_map<void*, Allocation> live_;
  size_t current_ = 0;
  size_t peak_ = 0;
};

/// Installs TrackingAllocator::instance() as the CPU allocator for its lifetime and restores the
/// previous one afterwards. Not re-entrant: nesting two of them is an error. Install and restore
/// must happen while no other thread is allocating (c10::SetCPUAllocator is not thread-safe).
class ScopedTrackingAllocator {
 public:
  ScopedTrackingAllocator();
  ~ScopedTrackingAllocator();
  ScopedTrackingAllocator(const ScopedTrackingAllocator&) = delete;
  ScopedTrackingAllocator& operator=(const ScopedTrackingAllocator&) = delete;

  TrackingAllocator& tracker() { return TrackingAllocator::instance(); }

 private:
  c10::Allocator* previous_;
};

/// Peak bytes of one measured region: max bytes in use during the region minus bytes in use at its
/// start, so tensors that already existed (inputs, weights) are excluded.
class PeakWindow {
 public:
  explicit PeakWindow(TrackingAllocator& tracker);
  /// Peak growth since construction, in bytes.
  size_t peak_growth() const;
  /// Bytes in use when the window opened.
  size_t start_bytes() const { return start_; }

 private:
  TrackingAllocator& tracker_;
  size_t start_;
};

}  // namespace convnn::bench
