// The tracking allocator counts what ATen allocates while it is installed, and restores the
// previous CPU allocator afterwards.
#include "convnn/bench/tracking_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

using convnn::bench::PeakWindow;
using convnn::bench::ScopedTrackingAllocator;
using convnn::bench::TrackingAllocator;

TEST(TrackingAllocator, CountsAllocationAndFree) {
  ScopedTrackingAllocator scoped;
  auto& tracker = scoped.tracker();
  const size_t start = tracker.current_bytes();
  PeakWindow window(tracker);
  constexpr int64_t kElements = 1 << 20;
  const size_t size = kElements * sizeof(float);
  {
    const auto t = at::empty({kElements}, at::kFloat);
    EXPECT_GE(tracker.current_bytes(), start + size);
    EXPECT_GE(window.peak_growth(), size);
  }
  EXPECT_EQ(tracker.current_bytes(), start);
  EXPECT_GE(window.peak_growth(), size);  // the peak remembers the freed tensor
}

TEST(TrackingAllocator, PeakWindowExcludesWhatAlreadyExisted) {
  ScopedTrackingAllocator scoped;
  auto& tracker = scoped.tracker();
  const auto existing = at::ones({1 << 20}, at::kFloat);
  PeakWindow window(tracker);
  const auto small = at::ones({1000}, at::kFloat);
  EXPECT_GE(window.peak_growth(), 1000 * sizeof(float));
  EXPECT_LT(window.peak_growth(), static_cast<size_t>(existing.nbytes()));
}

TEST(TrackingAllocator, InstallsAndRestoresTheCpuAllocator) {
  auto* const before = c10::GetCPUAllocator();
  at::Tensor survivor;
  {
    ScopedTrackingAllocator scoped;
    EXPECT_EQ(c10::GetCPUAllocator(), &TrackingAllocator::instance());
    survivor = at::arange(1000, at::kFloat);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  // A tensor allocated while installed stays valid, and is freed through the tracker afterwards.
  EXPECT_EQ(survivor.sum().item<float>(), 999.0f * 1000.0f / 2.0f);
  const size_t current = TrackingAllocator::instance().current_bytes();
  survivor = at::Tensor();
  EXPECT_EQ(TrackingAllocator::instance().current_bytes(), current - 1000 * sizeof(float));
}

TEST(TrackingAllocator, RawAllocateAndCloneWork) {
  ScopedTrackingAllocator scoped;
  auto& tracker = scoped.tracker();
  const size_t start = tracker.current_bytes();
  void* raw = tracker.raw_allocate(256);
  EXPECT_EQ(tracker.current_bytes(), start + 256);
  static_cast<char*>(raw)[0] = 42;
  {
    const auto copy = tracker.clone(raw, 256);
    EXPECT_EQ(static_cast<const char*>(copy.get())[0], 42);
  }
  tracker.raw_deallocate(raw);
  EXPECT_EQ(tracker.current_bytes(), start);
}

TEST(TrackingAllocator, AutogradThroughTheTrackerBalances) {
  ScopedTrackingAllocator scoped;
  auto& tracker = scoped.tracker();
  const auto step = [] {
    auto x = torch::randn({64, 64}, torch::requires_grad());
    (x.mm(x).relu().sum()).backward();
    return x.grad().defined();
  };
  ASSERT_TRUE(step());  // first use may create lasting caches; they are not leaks
  const size_t start = tracker.current_bytes();
  {
    auto x = torch::randn({64, 64}, torch::requires_grad());
    (x.mm(x).relu().sum()).backward();
    EXPECT_TRUE(x.grad().defined());
  }
  EXPECT_EQ(tracker.current_bytes(), start);
}

}  // namespace
