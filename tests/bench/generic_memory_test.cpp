// The device-generic knn_select (src/ops/generic) never holds the whole [N,M] score matrix: at
// N = M = 16384, K = 9, D = 64 (one slice, float32) its forward and backward together stay under
// the block budget plus a few per-slot tensors, far below the 1 GiB that the [N,M] float scores
// alone would take, and the forward's peak follows the budget. Memory is the bench's tracking
// allocator's high-water mark (every CPU tensor ATen allocates; BLAS and sort scratch are not
// tensors and are not counted, as in `convnn bench`).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>

#include "convnn/bench/tracking_allocator.h"
#include "ops/generic/generic.h"

namespace {

namespace generic = convnn::ops::generic;
using convnn::bench::PeakWindow;
using convnn::bench::ScopedTrackingAllocator;

constexpr int64_t kN = 16384, kK = 9, kD = 64;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kFloat = sizeof(float), kLong = sizeof(int64_t);

// Sets the generic path's block budget for one scope and restores the previous one.
class ScopedBlockBytes {
 public:
  explicit ScopedBlockBytes(int64_t bytes) : previous_(generic::block_bytes()) { generic::set_block_bytes(bytes); }
  ~ScopedBlockBytes() { generic::set_block_bytes(previous_); }
  ScopedBlockBytes(const ScopedBlockBytes&) = delete;
  ScopedBlockBytes& operator=(const ScopedBlockBytes&) = delete;

 private:
  int64_t previous_;
};

struct Peaks {
  int64_t forward = 0;           // during the forward, its outputs included
  int64_t forward_backward = 0;  // from the forward's start to the end of the backward
};

// One forward and backward of the generic knn_select with scaled dot products, the outputs of the
// forward alive through the backward (as autograd keeps them). Inputs and the upstream gradient
// exist before the window opens, so they are not counted.
Peaks measure(int64_t budget) {
  ScopedBlockBytes scoped_budget(budget);
  ScopedTrackingAllocator scoped;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(15);
  const auto options = at::TensorOptions().dtype(at::kFloat);
  const auto queries = at::randn({1, kN, kD}, gen, options);
  const auto keys = at::randn({1, kN, kD}, gen, options);
  const auto grad_scores = at::randn({1, kN, kK}, gen, options);
  Peaks peaks;
  PeakWindow whole(scoped.tracker());
  const auto [scores, indices] = generic::knn_select(queries, keys, kK, "scaled_dot", c10::nullopt, false);
  peaks.forward = static_cast<int64_t>(whole.peak_growth());
  const auto [grad_queries, grad_keys] =
      generic::knn_select_backward(grad_scores, queries, keys, indices, scores, "scaled_dot");
  peaks.forward_backward = static_cast<int64_t>(whole.peak_growth());
  EXPECT_EQ(grad_keys.sizes(), keys.sizes());
  return peaks;
}

// The bound, derived from src/ops/generic (knn_select_generic.cpp, rows.cpp), with B the block
// budget and a slot one of the N*K selected (query, key) pairs:
// - forward: one block of rows at a time holds its [rows, M] ranking keys and the rank and bool
//   tests of the two-pass top-k; the block is sized at 24 bytes per score (select_bytes_per_score),
//   more than the ~9 live at once, so the block's tensors stay under B. Then the outputs:
//   scores N*K*4 and indices N*K*8 bytes.
// - backward: nothing of size N*M. It holds per-slot [N,K,D] float tensors (36 MiB each here):
//   the two pair gradients and their two products with the upstream gradient, while the
//   inverse-index sum (sum_into_rows) holds its sorted copy (on CPU segment_reduce then writes only
//   the [M,D] sums; the doubling scan of other devices adds a clone and a masked temporary):
//   seven at the peak, counted as 8*N*K*D*4 bytes. Beside them a
//   few int64 per-slot tensors (sort keys, sorted keys, order, ones for the counts), counted as
//   8*N*K*8. Its outputs are grad_queries N*D*4 and grad_keys M*D*4 bytes (here M = N).
// Forward and backward do not overlap, so B + both per-slot terms + all outputs bounds the whole.
// Inputs and the upstream gradient exist before the window opens and are not counted.
int64_t outputs_bytes() { return kN * kK * (kFloat + kLong) + 2 * kN * kD * kFloat; }
int64_t per_slot_bytes() { return 8 * kN * kK * kD * kFloat + 8 * kN * kK * kLong; }
int64_t forward_backward_bound(int64_t budget) { return budget + per_slot_bytes() + outputs_bytes(); }

TEST(GenericMemory, KnnSelectForwardBackwardStaysUnderTheBlockBudgetPlusPerSlotTensors) {
  constexpr int64_t kScoreMatrixBytes = kN * kN * kFloat;  // 1 GiB
  const int64_t large = 256 * kMiB, small = 64 * kMiB;      // the default budget, and a quarter of it
  // The bound itself must rule out the [N,M] matrix, or passing it would prove nothing.
  ASSERT_LT(forward_backward_bound(large), kScoreMatrixBytes);
  const auto at_large = measure(large);
  const auto at_small = measure(small);
  for (const auto& [budget, peaks] : {std::pair{large, at_large}, std::pair{small, at_small}}) {
    SCOPED_TRACE("block budget " + std::to_string(budget / kMiB) + " MiB; peaks: forward " +
                 std::to_string(peaks.forward / kMiB) + " MiB, forward+backward " +
                 std::to_string(peaks.forward_backward / kMiB) + " MiB");
    EXPECT_LE(peaks.forward, budget + kN * kK * (kFloat + kLong));
    EXPECT_LE(peaks.forward_backward, forward_backward_bound(budget));
  }
  // The forward's peak follows the budget: blocks a quarter the size (169 rows against 656 here).
  EXPECT_LT(at_small.forward, at_large.forward / 2);
}

}  // namespace
