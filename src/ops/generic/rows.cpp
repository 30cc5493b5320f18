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

namespace {

// Each run's terms added in slot order by aten::segment_reduce: one pass over the terms. Its CPU
// kernel loops over each segment's terms in order, and its CUDA kernel does the same per segment
// and channel (for one channel it calls CUB's segmented reduction, also of a fixed order): no
// atomics, so every call on a device gives the same bits; a NaN or Inf stays in its run. Empty
// runs (rows no slot chose) get the initial 0.
at::Tensor sum_runs_segmented(const at::Tensor& sorted_terms, const at::Tensor& run_lengths) {
  return at::segment_reduce(sorted_terms, "sum", run_lengths, /*indices=*/c10::nullopt,
                            /*offsets=*/c10::nullopt, /*axis=*/0, /*unsafe=*/true, /*initial=*/0);
}

// The same sums for devices without a segment_reduce kernel (Meta, MPS, ...): a segmented doubling
// scan, log2(slots) passes. At step d every position adds the partial sum d places back if it lies
// in the same run; the terms of a run are combined in an order fixed by the run's length and
// position alone, and the last position of each run holds the row's total.
at::Tensor sum_runs_by_doubling(at::Tensor sums, const at::Tensor& target, const at::Tensor& run_lengths) {
  const int64_t slots = sums.size(0);
  for (int64_t d = 1; d < slots; d *= 2) {
    const auto other_run = (target.narrow(0, d, slots - d) != target.narrow(0, 0, slots - d)).unsqueeze(1);
    auto next = sums.clone();
    next.narrow(0, d, slots - d).add_(sums.narrow(0, 0, slots - d).masked_fill(other_run, 0));
    sums = std::move(next);
  }
  // Integer counts are exact in any order; their running total points at each run's last slot.
  const auto run_end = run_lengths.cumsum(0).sub_(1).clamp_min_(0);
  return sums.index({run_end}).masked_fill_((run_lengths == 0).unsqueeze(1), 0);
}

bool has_segment_reduce(const at::Tensor& t) { return t.is_cpu() || t.is_cuda(); }

}  // namespace

// The inverse index: the slots sorted stably by the row they feed (flattened as g * M + row), so
// each row's terms form one run in slot order, then summed run by run.
at::Tensor sum_into_rows(const at::Tensor& per_slot, const at::Tensor& indices, int64_t m) {
  const int64_t g = indices.size(0), c = per_slot.size(3);
  if (indices.numel() == 0 || c == 0) return at::zeros({g, m, c}, per_slot.options());
  const auto slice_start = at::arange(g, indices.options()).mul_(m).view({g, 1, 1});
  const auto [target, order] =
      at::sort((indices + slice_start).reshape({-1}), c10::optional<bool>(true), /*dim=*/0);
  const auto sorted_terms =
      per_slot.reshape({-1, c}).index({order}).to(at::toOpMathType(per_slot.scalar_type()));
  const auto run_lengths = at::zeros({g * m}, indices.options()).scatter_add_(0, target, at::ones_like(target));
  const auto totals = has_segment_reduce(sorted_terms) ? sum_runs_segmented(sorted_terms, run_lengths)
                                                       : sum_runs_by_doubling(sorted_terms, target, run_lengths);
  return totals.to(per_slot.scalar_type()).view({g, m, c});
}

}  // namespace convnn::ops::generic
