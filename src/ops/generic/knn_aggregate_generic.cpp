// Generic knn_aggregate and its backward (src/ops/generic/generic.h): the paper's Algorithm 1 as
// einsums over gathered neighbourhoods, the forward in blocks of query rows, the value gradient
// through the deterministic inverse index of rows.cpp.
#include <ATen/ATen.h>
#include <torch/library.h>

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

at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights,
                         const at::Tensor& indices, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>& bias) {
  checks::check_aggregate_inputs(values, weights, indices, kernel, bias);
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

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  checks::check_aggregate_backward_inputs(grad_output, values, weights, indices, kernel);
  const auto [want_values, want_weights, want_kernel, want_bias] = output_mask;
  const bool depthwise = kernel.dim() == 2;
  const auto& dy = grad_output;  // [G,N,C']
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
  // einsum may answer a permuted view; the Meta kernel (and torch.compile's check) says contiguous.
  if (grad_kernel.defined()) grad_kernel = grad_kernel.contiguous();
  return {grad_values, grad_weights, grad_kernel, grad_bias};
}

TORCH_LIBRARY_IMPL(convnn, CompositeExplicitAutograd, m) {
  m.impl("knn_aggregate", &knn_aggregate);
  m.impl("knn_aggregate_backward", &knn_aggregate_backward);
}

}  // namespace convnn::ops::generic
