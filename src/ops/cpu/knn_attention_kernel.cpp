// Fused attention forward: the contract is in knn_attention_kernel.h. The select and aggregation
// kernels run on the task's sub-problem (pointers offset to the block); called inside this
// parallel loop, their own parallel loops run inline on the calling thread.
#include "ops/cpu/knn_attention_kernel.h"

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "ops/kernels/rho.h"

namespace convnn::cpu {
namespace {

// The work splits into tasks by the shapes alone, so results never depend on the thread count.
// A task is a run of whole slices, or a block of one slice's rows (a multiple of the select
// kernel's 64-row blocks): about kTaskRows query rows, and at least kMinTasks tasks where the
// problem allows. Tasks amortise each call's set-up (the select kernel's buffers, the value side's
// transformed candidates) over many rows while their data stays in cache.
constexpr int64_t kSelectRows = 64;
constexpr int64_t kTaskRows = 256;
constexpr int64_t kMinTasks = 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Tasks {
  int64_t slices_per_task = 1;  // > 1 only with whole slices
  int64_t rows_per_task = 0;    // < N only with one slice per task
  int64_t slice_groups = 0;
  int64_t row_blocks = 0;       // per slice group
  int64_t count() const { return slice_groups * row_blocks; }
};

Tasks split_tasks(int64_t slices, int64_t rows) {
  Tasks t;
  t.slices_per_task = std::clamp<int64_t>(kTaskRows / std::max<int64_t>(1, rows), 1,
                                          ceil_div(slices, kMinTasks));
  t.slice_groups = ceil_div(slices, t.slices_per_task);
  const int64_t blocks = t.slices_per_task > 1 ? 1
                                               : std::min(ceil_div(rows, kSelectRows),
                                                          ceil_div(kMinTasks, slices));
  t.rows_per_task = ceil_div(ceil_div(rows, blocks), kSelectRows) * kSelectRows;
  t.row_blocks = ceil_div(rows, t.rows_per_task);
  return t;
}

// Slices [g, g + slices) and their rows [row_begin, row_begin + rows); rows < N only when
// slices == 1.
struct Block {
  int64_t g, slices, row_begin, rows;
};

template <typename scalar_t, typename acc_t>
KnnSelectParams<scalar_t, acc_t> select_block(const KnnSelectParams<scalar_t, acc_t>& p, const Block& b) {
  KnnSelectParams<scalar_t, acc_t> block = p;
  const int64_t first_row = b.g * p.queries_n + b.row_begin;
  const int64_t mask_offset = b.g * p.mask_slice_stride + b.row_begin * p.keys_m;
  block.queries += first_row * p.features;
  block.keys += b.g * p.keys_slice_stride;
  if (block.mask_bool) block.mask_bool += mask_offset;
  if (block.mask_additive) block.mask_additive += mask_offset;
  block.slices = b.slices;
  block.queries_n = b.rows;
  block.scores += first_row * p.k;
  block.indices += first_row * p.k;
  return block;
}

template <typename scalar_t>
AggregateForwardParams<scalar_t> aggregate_block(const AggregateForwardParams<scalar_t>& p, const Block& b) {
  AggregateForwardParams<scalar_t> block = p;
  block.sizes.g = b.slices;
  block.sizes.n = b.rows;
  block.values.data = p.values.row(b.g, 0);
  block.weights.data = &p.weights.at(b.g, b.row_begin, 0);
  block.indices.data = &p.indices.at(b.g, b.row_begin, 0);
  block.out.data = p.out.row(b.g, b.row_begin);
  return block;
}

}  // namespace

template <typename scalar_t, typename acc_t>
bool knn_attention_forward(const KnnAttentionParams<scalar_t, acc_t>& p) {
  const auto& sel = p.select;
  const Tasks tasks = split_tasks(sel.slices, sel.queries_n);
  // The kernel is laid out once here, not once per task.
  std::vector<acc_t> kernel_layouts(prepared_forward_kernel_size(p.aggregate.sizes));
  auto aggregate = p.aggregate;
  aggregate.prepared = prepare_forward_kernel(aggregate, kernel_layouts.data());
  std::atomic<bool> rankable{true};
  // Plain integers into the lambda: in a unity build this file is an included one, where GCC
  // warns of a closure that holds a reference to a type of the anonymous namespace.
  const int64_t row_blocks = tasks.row_blocks, slices_per_task = tasks.slices_per_task;
  const int64_t rows_per_task = tasks.rows_per_task;
  at::parallel_for(0, tasks.count(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end && rankable.load(std::memory_order_relaxed); ++t) {
      Block b;
      b.g = t / row_blocks * slices_per_task;
      b.slices = std::min(slices_per_task, sel.slices - b.g);
      b.row_begin = t % row_blocks * rows_per_task;
      b.rows = std::min(rows_per_task, sel.queries_n - b.row_begin);
      const auto select = select_block(sel, b);
      if (!knn_select_forward(select)) {
        rankable = false;
        return;
      }
      scalar_t* weights = p.weights + (b.g * sel.queries_n + b.row_begin) * sel.k;
      for (int64_t r = 0; r < b.slices * b.rows; ++r) {
        kernels::rho_row(select.scores + r * sel.k, sel.k, p.rho, p.temperature, weights + r * sel.k);
      }
      if (aggregate.sizes.c_out > 0) knn_aggregate_forward_kernel(aggregate_block(aggregate, b));
    }
  });
  return rankable.load();
}

template <typename scalar_t, typename acc_t>
void softmax_rho_backward(const scalar_t* weights, const scalar_t* grad_weights, int64_t rows,
                          int64_t k, acc_t temperature, scalar_t* grad_scores) {
  const int64_t grain = std::max<int64_t>(1, 4096 / k);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      kernels::softmax_rho_backward_row(weights + r * k, grad_weights + r * k, k, temperature,
                               grad_scores + r * k);
    }
  });
}

#define CONVNN_INSTANTIATE_ATTENTION(scalar_t)                                                      \
  template bool knn_attention_forward(const KnnAttentionParams<scalar_t, at::opmath_type<scalar_t>>&); \
  template void softmax_rho_backward(const scalar_t*, const scalar_t*, int64_t, int64_t,            \
                                     at::opmath_type<scalar_t>, scalar_t*);
CONVNN_INSTANTIATE_ATTENTION(double)
CONVNN_INSTANTIATE_ATTENTION(float)
CONVNN_INSTANTIATE_ATTENTION(c10::BFloat16)
CONVNN_INSTANTIATE_ATTENTION(c10::Half)
#undef CONVNN_INSTANTIATE_ATTENTION

}  // namespace convnn::cpu
