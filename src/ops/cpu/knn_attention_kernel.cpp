// Fused attention forward and backward: the contracts are in knn_attention_kernel.h. The select and
// aggregation kernels run on the task's sub-problem (pointers offset to the block); called inside
// this parallel loop, their own parallel loops run inline on the calling thread.
#include "ops/cpu/knn_attention_kernel.h"

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

#include "ops/cpu/partial_sums.h"
#include "ops/cpu/shared_inverse_index.h"
#include "ops/cpu/upcoming_lines.h"
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

// Task t's block, of `slices` slices of `rows` rows split as Tasks says (its fields passed one by
// one, for the lambdas of knn_attention_forward).
Block task_block(int64_t slices_per_task, int64_t row_blocks, int64_t rows_per_task, int64_t slices, int64_t rows,
                 int64_t t) {
  Block b;
  b.g = t / row_blocks * slices_per_task;
  b.slices = std::min(slices_per_task, slices - b.g);
  b.row_begin = t % row_blocks * rows_per_task;
  b.rows = std::min(rows_per_task, rows - b.row_begin);
  return b;
}

// Lists what the forward task of block `next` reads that the task before it (of block `now`) did
// not: its query rows and, from another slice, that slice's keys and values; paced over the row
// loops of the task of block `now` (its selection's, then its aggregation's).
template <typename scalar_t, typename acc_t>
void list_forward_task(const KnnAttentionParams<scalar_t, acc_t>& p, const Block& now, const Block& next,
                       UpcomingLines& lines) {
  const auto& sel = p.select;
  const int64_t bytes = sizeof(scalar_t);
  lines.add(sel.queries + (next.g * sel.queries_n + next.row_begin) * sel.features,
            next.slices * next.rows * sel.features * bytes);
  if (next.g != now.g) {
    lines.add(sel.keys + next.g * sel.keys_slice_stride, next.slices * sel.keys_slice_stride * bytes);
    lines.add(p.aggregate.values.row(next.g, 0), next.slices * p.aggregate.values.stride_g * bytes);
  }
  lines.pace(2 * now.slices * now.rows);
}

template <typename scalar_t, typename acc_t>
KnnSelectParams<scalar_t, acc_t> select_block(const KnnSelectParams<scalar_t, acc_t>& p, const Block& b) {
  KnnSelectParams<scalar_t, acc_t> block = p;
  const int64_t first_row = b.g * p.queries_n + b.row_begin;
  const int64_t mask_offset = p.mask_slice_offset(b.g) + b.row_begin * p.keys_m;
  block.queries += first_row * p.features;
  block.keys += b.g * p.keys_slice_stride;
  if (block.mask_bool) block.mask_bool += mask_offset;
  if (block.mask_additive) block.mask_additive += mask_offset;
  block.mask_slice_phase = (b.g + p.mask_slice_phase) % p.slices_per_mask_slice;
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

// ---- Backward --------------------------------------------------------------------------------

// A backward task's slices: about this many bytes of rows read and written, within one core's
// share of L2 on the CPUs measured (1 MiB per core on AMD Zen 4 and 5, 2 MiB on recent Xeons), so
// that each step after the first finds them in cache. Measured at the paper's Table 1 shape on
// AMD Zen 5, the backward per slice took 1.7x as long over 384 slices as over 4 to 32 (in cache).
constexpr int64_t kBackwardTaskBytes = int64_t{768} << 10;

struct SliceTasks {
  int64_t slices_per_task = 1;
  int64_t count = 0;
};

template <typename scalar_t, typename acc_t>
SliceTasks split_backward_tasks(const KnnAttentionBackwardParams<scalar_t, acc_t>& p) {
  const auto& s = p.aggregate.sizes;
  const int64_t d = p.select.features;
  // Per slice: dy, the queries and d(queries), and the slots' weights, scores and two gradients on
  // the query side; the values, keys and their gradients on the candidate side; the indices.
  const int64_t slice_bytes =
      static_cast<int64_t>(sizeof(scalar_t)) * (s.n * (s.c_out + 2 * d + 4 * s.k) + s.m * (2 * s.c + 2 * d)) +
      static_cast<int64_t>(sizeof(int64_t)) * s.n * s.k;
  SliceTasks t;
  t.slices_per_task = std::clamp<int64_t>(kBackwardTaskBytes / std::max<int64_t>(1, slice_bytes), 1,
                                          std::max<int64_t>(1, s.g / kMinTasks));
  t.count = ceil_div(s.g, t.slices_per_task);
  return t;
}

// Slices [g0, g0 + slices) of the aggregation backward.
template <typename scalar_t>
AggregateBackwardParams<scalar_t> aggregate_backward_slices(const AggregateBackwardParams<scalar_t>& p,
                                                            int64_t g0, int64_t slices) {
  AggregateBackwardParams<scalar_t> b = p;
  b.sizes.g = slices;
  b.grad_output.data = p.grad_output.row(g0, 0);
  b.values.data = p.values.row(g0, 0);
  b.weights.data = &p.weights.at(g0, 0, 0);
  b.indices.data = &p.indices.at(g0, 0, 0);
  b.grad_values.data = p.grad_values.row(g0, 0);
  return b;
}

// Slices [g0, g0 + slices) of the select backward, with their d(scores) [slices, N, K] contiguous.
template <typename scalar_t, typename acc_t>
KnnSelectBackwardParams<scalar_t, acc_t> select_backward_slices(const KnnSelectBackwardParams<scalar_t, acc_t>& p,
                                                                int64_t g0, int64_t slices,
                                                                const scalar_t* grad_scores) {
  KnnSelectBackwardParams<scalar_t, acc_t> b = p;
  b.queries += g0 * p.queries_n * p.features;
  b.keys += g0 * p.keys_m * p.features;
  b.indices.data = &p.indices.at(g0, 0, 0);
  b.scores.data = &p.scores.at(g0, 0, 0);
  b.grad_scores = {grad_scores, p.queries_n * p.k, p.k, 1};
  b.slices = slices;
  b.grad_queries += g0 * p.queries_n * p.features;
  b.grad_keys += g0 * p.keys_m * p.features;
  return b;
}

// Lists the rows that the backward task of slices [g, g + slices) reads, paced over the row loops
// of a task of as many slices.
template <typename scalar_t, typename acc_t>
void list_backward_task(const KnnAttentionBackwardParams<scalar_t, acc_t>& p, int64_t g, int64_t slices,
                        UpcomingLines& lines) {
  const auto& a = p.aggregate;
  const auto& s = a.sizes;
  const int64_t bytes = sizeof(scalar_t), slots = slices * s.n * s.k;
  lines.add(a.grad_output.row(g, 0), slices * a.grad_output.stride_g * bytes);
  lines.add(a.values.row(g, 0), slices * a.values.stride_g * bytes);
  lines.add(&a.weights.at(g, 0, 0), slots * bytes);
  lines.add(&a.indices.at(g, 0, 0), slots * static_cast<int64_t>(sizeof(int64_t)));
  // The rows that the steps' loops visit: the aggregation's over queries then values, the
  // selection's over queries then keys.
  int64_t row_steps = slices * (s.n + s.m);
  if (p.score_gradient) {
    const auto& q = p.select;
    lines.add(q.queries + g * q.queries_n * q.features, slices * q.queries_n * q.features * bytes);
    lines.add(q.keys + g * q.keys_m * q.features, slices * q.keys_m * q.features * bytes);
    lines.add(&q.scores.at(g, 0, 0), slots * bytes);
    row_steps += slices * (q.queries_n + q.keys_m);
  }
  // All of them asked for within the first half of the rows (measured at Table 1 on AMD Zen 5,
  // alternating runs: 5 % faster than spread over all the rows, 8 % than over 1.5 times as many).
  lines.pace(row_steps / 2);
}

// The backward of slices [g0, g0 + slices): their d(kernel) and d(bias) into grad_kernel and
// grad_bias (where not null), everything else into the outputs p names. grad_weights and
// grad_scores are the task's scratch.
template <typename scalar_t, typename acc_t>
void backward_task(const KnnAttentionBackwardParams<scalar_t, acc_t>& p, int64_t g0, int64_t slices,
                   scalar_t* grad_kernel, scalar_t* grad_bias, std::vector<scalar_t>& grad_weights,
                   std::vector<scalar_t>& grad_scores) {
  const ShareInverseIndex share;  // d(values) and d(keys) route through one inverse index
  const auto& s = p.aggregate.sizes;
  const int64_t slots = slices * s.n * s.k;
  auto aggregate = aggregate_backward_slices(p.aggregate, g0, slices);
  aggregate.grad_kernel = grad_kernel;
  aggregate.grad_bias = grad_bias;
  if (p.score_gradient) {
    grad_weights.resize(slots);
    aggregate.grad_weights = {grad_weights.data(), s.n * s.k, s.k, 1};
  }
  knn_aggregate_backward_kernel(aggregate);
  if (!p.score_gradient) return;
  grad_scores.resize(slots);
  softmax_rho_backward(p.weights + g0 * s.n * s.k, grad_weights.data(), slices * s.n, s.k, p.temperature,
                       grad_scores.data());
  knn_select_backward(select_backward_slices(p.select, g0, slices, grad_scores.data()));
}

}  // namespace

bool attention_backward_splits_by_slices(int64_t slices) { return slices >= kMinTasks; }

template <typename scalar_t, typename acc_t>
void knn_attention_backward(const KnnAttentionBackwardParams<scalar_t, acc_t>& p) {
  static_assert(std::is_same_v<scalar_t, acc_t>, "the tasks' partial d(kernel) is in the input type");
  const auto& s = p.aggregate.sizes;
  const SliceTasks tasks = split_backward_tasks(p);
  const int64_t kernel_size = p.aggregate.grad_kernel ? s.k * s.c * (s.depthwise ? 1 : s.c_out) : 0;
  const int64_t bias_size = p.aggregate.grad_bias ? s.c_out : 0;
  const int64_t partial_size = kernel_size + bias_size;
  // Each chunk of tasks adds its tasks' d(kernel) then d(bias), in task order, into its partial.
  const Chunking chunks = chunk_units(tasks.count, 1, partial_size * static_cast<int64_t>(sizeof(scalar_t)));
  std::vector<scalar_t> partials(chunks.count * partial_size);
  // Plain integers into the lambda (as in the forward below).
  const int64_t slices_per_task = tasks.slices_per_task, task_count = tasks.count;
  const int64_t tasks_per_chunk = chunks.units_per_chunk;
  at::parallel_for(0, chunks.count, 1, [&](int64_t begin, int64_t end) {
    std::vector<scalar_t> task_partial(partial_size), grad_weights, grad_scores;
    const int64_t last_task = std::min(task_count, end * tasks_per_chunk);
    for (int64_t t = begin * tasks_per_chunk; t < last_task; ++t) {
      const int64_t g0 = t * slices_per_task, slices = std::min(slices_per_task, s.g - g0);
      UpcomingLines upcoming;
      if (t + 1 < last_task) list_backward_task(p, g0 + slices, std::min(slices_per_task, s.g - g0 - slices), upcoming);
      const UpcomingLinesScope listed(upcoming);
      backward_task(p, g0, slices, kernel_size > 0 ? task_partial.data() : nullptr,
                    bias_size > 0 ? task_partial.data() + kernel_size : nullptr, grad_weights, grad_scores);
      scalar_t* partial = partials.data() + t / tasks_per_chunk * partial_size;
      const bool first_of_chunk = t % tasks_per_chunk == 0;
      for (int64_t e = 0; e < partial_size; ++e) partial[e] = (first_of_chunk ? scalar_t(0) : partial[e]) + task_partial[e];
    }
  });
  pairwise_tree(chunks.count, [&](int64_t into, int64_t from) {
    for (int64_t e = 0; e < partial_size; ++e) partials[into * partial_size + e] += partials[from * partial_size + e];
  });
  if (kernel_size > 0) std::copy_n(partials.data(), kernel_size, p.aggregate.grad_kernel);
  if (bias_size > 0) std::copy_n(partials.data() + kernel_size, bias_size, p.aggregate.grad_bias);
}

template <typename scalar_t, typename acc_t>
bool knn_attention_forward(const KnnAttentionParams<scalar_t, acc_t>& p) {
  const auto& sel = p.select;
  const Tasks tasks = split_tasks(sel.slices, sel.queries_n);
  // The kernel is laid out once here, not once per task.
  std::vector<acc_t> kernel_layouts(prepared_forward_kernel_size(p.aggregate.sizes));
  auto aggregate = p.aggregate;
  aggregate.prepared = prepare_forward_kernel(aggregate, kernel_layouts.data());
  std::atomic<bool> rankable{true};
  // Plain integers into the lambdas: in a unity build this file is an included one, where GCC
  // warns of a closure that holds a reference to a type of the anonymous namespace.
  const int64_t row_blocks = tasks.row_blocks, slices_per_task = tasks.slices_per_task;
  const int64_t rows_per_task = tasks.rows_per_task;
  const auto block_of = [&](int64_t t) {
    return task_block(slices_per_task, row_blocks, rows_per_task, sel.slices, sel.queries_n, t);
  };
  at::parallel_for(0, tasks.count(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end && rankable.load(std::memory_order_relaxed); ++t) {
      const Block b = block_of(t);
      UpcomingLines upcoming;
      if (t + 1 < end) list_forward_task(p, b, block_of(t + 1), upcoming);
      const UpcomingLinesScope listed(upcoming);
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
template void knn_attention_backward(const KnnAttentionBackwardParams<double, double>&);
template void knn_attention_backward(const KnnAttentionBackwardParams<float, float>&);

}  // namespace convnn::cpu
