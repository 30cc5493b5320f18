// Generic knn_aggregate and its backward (src/ops/generic/generic.h): the paper's Algorithm 1 as
// einsums over gathered neighbourhoods, the forward in blocks of query rows, the value gradient
// through the deterministic inverse index of rows.cpp.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <tuple>
#include <vector>

#include "ops/checks.h"
#include "ops/generic/generic.h"
#include "ops/generic/internal.h"

namespace convnn::ops::generic {

at::Tensor aggregate_block(const at::Tensor& values, const at::Tensor& weights,
                           const at::Tensor& indices, const at::Tensor& kernel,
                           const c10::optional<at::Tensor>& bias) {
  const auto weighted = gather_rows(values, indices) * weights.unsqueeze(-1);  // [G,N,K,C]
  auto output = kernel.dim() == 2 ? at::einsum("gikc,ck->gic", {weighted, kernel})
                                  : at::einsum("gikc,ock->gio", {weighted, kernel});
  if (bias.has_value() && bias->defined()) output.add_(*bias);
  return output;
}

int64_t aggregate_bytes_per_row(const at::Tensor& values, int64_t k, const at::Tensor& kernel) {
  // The gathered and the weighted neighbourhoods, the einsum's reordered copy, and the output row.
  const int64_t element = static_cast<int64_t>(values.element_size());
  return (3 * k * values.size(2) + checks::output_channels(values, kernel)) * element;
}

at::Tensor knn_aggregate_checked(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                                 const at::Tensor& kernel, const c10::optional<at::Tensor>& bias) {
  const int64_t g = values.size(0), n = weights.size(1);
  auto output = at::empty({g, n, checks::output_channels(values, kernel)}, values.options());
  const int64_t bytes_per_row = aggregate_bytes_per_row(values, weights.size(2), kernel);
  for_each_row_block(g, n, bytes_per_row, [&](const RowBlock& block) {
    block_of(output, block).copy_(aggregate_block(values.narrow(0, block.slice, block.slices),
                                                  block_of(weights, block),
                                                  block_of(indices, block), kernel, bias));
  });
  return output;
}

namespace {

// The backward of one block of query rows: dy, weights and indices of the block's rows, values of
// its slices.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> aggregate_backward_block(
    const at::Tensor& dy, const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
    const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  const auto [want_values, want_weights, want_kernel, want_bias] = output_mask;
  const bool depthwise = kernel.dim() == 2;
  at::Tensor grad_values, grad_weights, grad_kernel, grad_bias;
  const auto neighbourhoods = (want_weights || want_kernel) ? gather_rows(values, indices) : at::Tensor();
  if (want_values || want_weights) {
    // dy pulled back through the kernel, per slot: [G,N,K,C].
    const auto through_kernel = depthwise ? dy.unsqueeze(2) * kernel.t()
                                          : at::einsum("gio,ock->gikc", {dy, kernel});
    if (want_weights) grad_weights = (neighbourhoods * through_kernel).sum(-1);
    if (want_values) {
      grad_values = sum_into_rows(through_kernel * weights.unsqueeze(-1), indices, values.size(1));
    }
  }
  if (want_kernel) {
    grad_kernel = depthwise ? at::einsum("gik,gikc,gic->ck", {weights, neighbourhoods, dy})
                            : at::einsum("gio,gik,gikc->ock", {dy, weights, neighbourhoods});
  }
  if (want_bias) grad_bias = dy.sum(std::vector<int64_t>{0, 1});
  return {grad_values, grad_weights, grad_kernel, grad_bias};
}

// Bytes the backward keeps live per query row of one slice: the gathered neighbourhoods, dy
// through the kernel, their products and the inverse index's copies, K channels each.
int64_t aggregate_backward_bytes_per_row(const at::Tensor& values, int64_t k, const at::Tensor& kernel) {
  const int64_t widest = std::max(values.size(2), checks::output_channels(values, kernel));
  return 6 * k * widest * static_cast<int64_t>(values.element_size()) +
         4 * k * static_cast<int64_t>(sizeof(int64_t));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward_checked(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  const int64_t g = values.size(0), n = weights.size(1), k = weights.size(2);
  if (g == 0 || n == 0) return aggregate_backward_block(grad_output, values, weights, indices, kernel, output_mask);
  // Per block of query rows, so that the per-slot [rows,K,C] tensors stay within the block budget;
  // sums over rows (values, kernel, bias) are added in block order (deterministic).
  BlockedGradient grad_values, grad_weights, grad_kernel, grad_bias;
  const auto bias_like = at::empty({checks::output_channels(values, kernel)}, values.options());
  for_each_row_block(g, n, aggregate_backward_bytes_per_row(values, k, kernel), [&](const RowBlock& block) {
    const auto [gv, gw, gkernel, gbias] = aggregate_backward_block(
        block_of(grad_output, block), values.narrow(0, block.slice, block.slices), block_of(weights, block),
        block_of(indices, block), kernel, output_mask);
    grad_values.add_slices(gv, values, block);
    grad_weights.copy_rows(gw, weights, block);
    grad_kernel.add_whole(gkernel, kernel);
    grad_bias.add_whole(gbias, bias_like);
  });
  return {grad_values.result(), grad_weights.result(), grad_kernel.result(), grad_bias.result()};
}

TORCH_LIBRARY_IMPL(convnn, CompositeExplicitAutograd, m) {
  op::implement<op::KnnAggregate>(m, knn_aggregate);
  op::implement<op::KnnAggregateBackward>(m, knn_aggregate_backward);
}

}  // namespace convnn::ops::generic
