// CPU kernels of knn_aggregate and knn_aggregate_backward (checked as src/ops/op_signatures.h says): dtype
// dispatch and the fused kernels of ops/cpu/knn_aggregate_kernel.h.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "ops/generic/generic.h"
#include "ops/cpu/knn_aggregate_cpu.h"

namespace convnn::cpu {

AggregateSizes aggregate_sizes(const at::Tensor& values, int64_t n, int64_t k, const at::Tensor& kernel) {
  AggregateSizes s;
  s.g = values.size(0);
  s.m = values.size(1);
  s.c = values.size(2);
  s.n = n;
  s.k = k;
  s.depthwise = kernel.dim() == 2;
  s.c_out = s.depthwise ? s.c : kernel.size(0);
  return s;
}

namespace {

// ---- knn_aggregate: glue between the dispatcher and the fused kernels ---------------------------

at::Tensor knn_aggregate_checked(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                                 const at::Tensor& kernel, const c10::optional<at::Tensor>& bias) {
  const AggregateSizes sizes = aggregate_sizes(values, weights.size(1), weights.size(2), kernel);
  auto out = at::empty({sizes.g, sizes.n, sizes.c_out}, values.options());
  if (out.numel() == 0) return out;
  const AggregateForwardInputs inputs(values, kernel, bias);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, values.scalar_type(),
                                  "knn_aggregate_cpu", [&] {
    knn_aggregate_forward_kernel(aggregate_forward_params<scalar_t>(sizes, inputs, weights, indices, out));
  });
  return out;
}

}  // namespace

AggregateBackwardTensors::AggregateBackwardTensors(const AggregateSizes& sizes, const at::Tensor& grad_output,
                                                   const at::Tensor& values, const at::Tensor& kernel,
                                                   std::array<bool, 4> output_mask)
    : grad_output_rows(unit_stride_rows(grad_output)),
      values_rows(unit_stride_rows(values)),
      kernel_dense(kernel.contiguous()) {
  const auto options = values.options();
  const auto empty_if = [&](bool wanted, c10::IntArrayRef shape) {
    return wanted ? at::empty(shape, options) : at::Tensor();
  };
  grad_values = empty_if(output_mask[0], {sizes.g, sizes.m, sizes.c});
  grad_weights = empty_if(output_mask[1], {sizes.g, sizes.n, sizes.k});
  grad_kernel = empty_if(output_mask[2], kernel.sizes());
  grad_bias = empty_if(output_mask[3], {sizes.c_out});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward_checked(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  const AggregateSizes sizes = aggregate_sizes(values, weights.size(1), weights.size(2), kernel);
  AggregateBackwardTensors t(sizes, grad_output, values, kernel, output_mask);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, values.scalar_type(),
                                  "knn_aggregate_backward_cpu", [&] {
    knn_aggregate_backward_kernel(aggregate_backward_params<scalar_t>(sizes, t, weights, indices));
  });
  return {t.grad_values, t.grad_weights, t.grad_kernel, t.grad_bias};
}

TORCH_LIBRARY_IMPL(convnn, CPU, m) {
  if (ops::generic::serves_cpu()) return;  // CompositeExplicitAutograd takes CPU calls
  ops::op::implement_checked<ops::op::KnnAggregate, &knn_aggregate_checked>(m);
  ops::op::implement_checked<ops::op::KnnAggregateBackward, &knn_aggregate_backward_checked>(m);
}

}  // namespace convnn::cpu
