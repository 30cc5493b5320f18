// Gathering rows by slot index, and its deterministic adjoint (src/ops/generic/internal.h).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include "ops/generic/internal.h"

namespace convnn::ops::generic {

at::Tensor gather_rows(const at::Tensor& rows, const at::Tensor& indices) {
  const int64_t g = indices.size(0), n = indices.size(1), k = indices.size(2), c = rows.size(2);
  const auto index = indices.reshape({g, n * k, 1}).expand({g, n * k, c});
  return rows.gather(1, index).view({g, n, k, c});
}

// The inverse index: the slots sorted stably by the row they feed (flattened as g * M + row), so
// each row's terms form one run in slot order. A segmented doubling scan then adds within runs: at
// step d every position adds the partial sum d places back if it lies in the same run. The terms
// of a run are combined in an order fixed by the run's length and position alone, with no atomics,
// so every device, thread count and block size gives the same bits; a NaN or Inf stays in its run.
// The last position of each run holds the row's total.
at::Tensor sum_into_rows(const at::Tensor& per_slot, const at::Tensor& indices, int64_t m) {
  const int64_t g = indices.size(0), c = per_slot.size(3);
  if (indices.numel() == 0 || c == 0) return at::zeros({g, m, c}, per_slot.options());
  const auto slice_start = at::arange(g, indices.options()).mul_(m).view({g, 1, 1});
  const auto [target, order] =
      at::sort((indices + slice_start).reshape({-1}), c10::optional<bool>(true), /*dim=*/0);
  auto sums = per_slot.reshape({-1, c}).index({order}).to(at::toOpMathType(per_slot.scalar_type()));
  const int64_t slots = sums.size(0);
  for (int64_t d = 1; d < slots; d *= 2) {
    const auto other_run = (target.narrow(0, d, slots - d) != target.narrow(0, 0, slots - d)).unsqueeze(1);
    auto next = sums.clone();
    next.narrow(0, d, slots - d).add_(sums.narrow(0, 0, slots - d).masked_fill(other_run, 0));
    sums = std::move(next);
  }
  // Integer counts are exact in any order; their running total points at each run's last slot.
  const auto counts = at::zeros({g * m}, indices.options()).scatter_add_(0, target, at::ones_like(target));
  const auto run_end = counts.cumsum(0).sub_(1).clamp_min_(0);
  auto totals = sums.index({run_end}).masked_fill_((counts == 0).unsqueeze(1), 0);
  return totals.to(per_slot.scalar_type()).view({g, m, c});
}

}  // namespace convnn::ops::generic
