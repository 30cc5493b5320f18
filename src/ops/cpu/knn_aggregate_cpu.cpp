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

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward_checked(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  const AggregateSizes sizes = aggregate_sizes(values, weights.size(1), weights.size(2), kernel);
  // Named variables, not a structured binding: C++17 lambdas cannot capture those (Clang refuses).
  const bool want_values = output_mask[0], want_weights = output_mask[1];
  const bool want_kernel = output_mask[2], want_bias = output_mask[3];
  const auto options = values.options();
  const auto empty_if = [&](bool wanted, c10::IntArrayRef shape) {
    return wanted ? at::empty(shape, options) : at::Tensor();
  };
  auto grad_values = empty_if(want_values, {sizes.g, sizes.m, sizes.c});
  auto grad_weights = empty_if(want_weights, {sizes.g, sizes.n, sizes.k});
  auto grad_kernel = empty_if(want_kernel, kernel.sizes());
  auto grad_bias = empty_if(want_bias, {sizes.c_out});
  const auto grad_output_rows = unit_stride_rows(grad_output);
  const auto values_rows = unit_stride_rows(values);
  const auto kernel_dense = kernel.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, values.scalar_type(),
                                  "knn_aggregate_backward_cpu", [&] {
    const auto data_or_null = [](at::Tensor& t) {
      return t.defined() ? t.mutable_data_ptr<scalar_t>() : nullptr;
    };
    AggregateBackwardParams<scalar_t> p;
    p.sizes = sizes;
    p.grad_output = rows_view<const scalar_t>(grad_output_rows);
    p.values = rows_view<const scalar_t>(values_rows);
    p.weights = slots_view<const scalar_t>(weights);
    p.indices = slots_view<const int64_t>(indices);
    p.kernel = kernel_dense.const_data_ptr<scalar_t>();
    if (want_values) p.grad_values = rows_view<scalar_t>(grad_values);
    if (want_weights) p.grad_weights = slots_view<scalar_t>(grad_weights);
    p.grad_kernel = data_or_null(grad_kernel);
    p.grad_bias = data_or_null(grad_bias);
    knn_aggregate_backward_kernel(p);
  });
  return {grad_values, grad_weights, grad_kernel, grad_bias};
}

TORCH_LIBRARY_IMPL(convnn, CPU, m) {
  if (ops::generic::serves_cpu()) return;  // CompositeExplicitAutograd takes CPU calls
  ops::op::implement_checked<ops::op::KnnAggregate, &knn_aggregate_checked>(m);
  ops::op::implement_checked<ops::op::KnnAggregateBackward, &knn_aggregate_backward_checked>(m);
}

}  // namespace convnn::cpu
