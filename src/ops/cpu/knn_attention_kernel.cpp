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

#include "ops/cpu/rho_kernel.h"

namespace convnn::cpu {
namespace {

// Query rows per task: a multiple of the select kernel's 64-row blocks, small enough that the
// block's values, weights and outputs stay in L2 between the three steps.
constexpr int64_t kAttentionRows = 256;

template <typename scalar_t, typename acc_t>
KnnSelectParams<scalar_t, acc_t> select_block(const KnnSelectParams<scalar_t, acc_t>& p, int64_t g,
                                              int64_t row_begin, int64_t rows) {
  KnnSelectParams<scalar_t, acc_t> block = p;
  const int64_t first_row = g * p.queries_n + row_begin;
  const int64_t mask_offset = g * p.mask_slice_stride + row_begin * p.keys_m;
  block.queries += first_row * p.features;
  block.keys += g * p.keys_m * p.features;
  if (block.mask_bool) block.mask_bool += mask_offset;
  if (block.mask_additive) block.mask_additive += mask_offset;
  block.mask_slice_stride = 0;
  block.slices = 1;
  block.queries_n = rows;
  block.scores += first_row * p.k;
  block.indices += first_row * p.k;
  return block;
}

template <typename scalar_t>
AggregateForwardParams<scalar_t> aggregate_block(const AggregateForwardParams<scalar_t>& p, int64_t g,
                                                 int64_t row_begin, int64_t rows) {
  AggregateForwardParams<scalar_t> block = p;
  block.sizes.g = 1;
  block.sizes.n = rows;
  block.values.data = p.values.row(g, 0);
  block.weights.data = &p.weights.at(g, row_begin, 0);
  block.indices.data = &p.indices.at(g, row_begin, 0);
  block.out.data = p.out.row(g, row_begin);
  return block;
}

}  // namespace

template <typename scalar_t, typename acc_t>
bool knn_attention_forward(const KnnAttentionParams<scalar_t, acc_t>& p) {
  const auto& sel = p.select;
  const int64_t blocks_per_slice = (sel.queries_n + kAttentionRows - 1) / kAttentionRows;
  std::atomic<bool> rankable{true};
  at::parallel_for(0, sel.slices * blocks_per_slice, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end && rankable.load(std::memory_order_relaxed); ++t) {
      const int64_t g = t / blocks_per_slice, row_begin = (t % blocks_per_slice) * kAttentionRows;
      const int64_t rows = std::min(kAttentionRows, sel.queries_n - row_begin);
      const auto select = select_block(sel, g, row_begin, rows);
      if (!knn_select_forward(select)) {
        rankable = false;
        return;
      }
      scalar_t* weights = p.weights + (g * sel.queries_n + row_begin) * sel.k;
      for (int64_t r = 0; r < rows; ++r) {
        rho_row(select.scores + r * sel.k, sel.k, p.rho, p.temperature, weights + r * sel.k);
      }
      if (p.aggregate.sizes.c_out > 0) {
        knn_aggregate_forward_kernel(aggregate_block(p.aggregate, g, row_begin, rows));
      }
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
      softmax_rho_backward_row(weights + r * k, grad_weights + r * k, k, temperature,
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
