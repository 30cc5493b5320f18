#pragma once
// CPU glue of knn_aggregate shared with the fused attention entry: the forward kernel's inputs in
// the layouts it reads, and its parameter struct.
#include <ATen/core/Tensor.h>
#include <array>
#include <tuple>
#include <c10/util/Optional.h>

#include "ops/cpu/knn_aggregate_kernel.h"
#include "ops/cpu/tensor_views.h"
#include "ops/op_signatures.h"

namespace convnn::cpu {

// values [G,M,C] with weights/indices [G,n,k] and kernel [C,k] or [C',C,k].
AggregateSizes aggregate_sizes(const at::Tensor& values, int64_t n, int64_t k, const at::Tensor& kernel);

// The tensors the forward kernel reads: unit-stride value rows, a dense kernel and bias.
struct AggregateForwardInputs {
  AggregateForwardInputs(const at::Tensor& values, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>& bias)
      : values_rows(unit_stride_rows(values)),
        kernel_dense(kernel.contiguous()),
        bias_dense(bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor()) {}
  at::Tensor values_rows, kernel_dense, bias_dense;
};

template <typename scalar_t>
AggregateForwardParams<scalar_t> aggregate_forward_params(const AggregateSizes& sizes,
                                                          const AggregateForwardInputs& inputs,
                                                          const at::Tensor& weights,
                                                          const at::Tensor& indices,
                                                          const at::Tensor& out) {
  AggregateForwardParams<scalar_t> p;
  p.sizes = sizes;
  p.values = rows_view<const scalar_t>(inputs.values_rows);
  p.weights = slots_view<const scalar_t>(weights);
  p.indices = slots_view<const int64_t>(indices);
  p.kernel = inputs.kernel_dense.const_data_ptr<scalar_t>();
  p.bias = inputs.bias_dense.defined() ? inputs.bias_dense.const_data_ptr<scalar_t>() : nullptr;
  p.out = rows_view<scalar_t>(out);
  return p;
}

// The tensors the backward kernel reads (unit-stride rows of dy and the values, a dense kernel), and
// the gradients it writes: allocated where output_mask (values, weights, kernel, bias) asks.
struct AggregateBackwardTensors {
  AggregateBackwardTensors(const AggregateSizes& sizes, const at::Tensor& grad_output, const at::Tensor& values,
                           const at::Tensor& kernel, std::array<bool, 4> output_mask);
  at::Tensor grad_output_rows, values_rows, kernel_dense;
  at::Tensor grad_values, grad_weights, grad_kernel, grad_bias;
};

template <typename scalar_t>
AggregateBackwardParams<scalar_t> aggregate_backward_params(const AggregateSizes& sizes,
                                                            AggregateBackwardTensors& t,
                                                            const at::Tensor& weights,
                                                            const at::Tensor& indices) {
  const auto data_or_null = [](at::Tensor& out) {
    return out.defined() ? out.mutable_data_ptr<scalar_t>() : nullptr;
  };
  AggregateBackwardParams<scalar_t> p;
  p.sizes = sizes;
  p.grad_output = rows_view<const scalar_t>(t.grad_output_rows);
  p.values = rows_view<const scalar_t>(t.values_rows);
  p.weights = slots_view<const scalar_t>(weights);
  p.indices = slots_view<const int64_t>(indices);
  p.kernel = t.kernel_dense.const_data_ptr<scalar_t>();
  if (t.grad_values.defined()) p.grad_values = rows_view<scalar_t>(t.grad_values);
  if (t.grad_weights.defined()) p.grad_weights = slots_view<scalar_t>(t.grad_weights);
  p.grad_kernel = data_or_null(t.grad_kernel);
  p.grad_bias = data_or_null(t.grad_bias);
  return p;
}

// knn_aggregate_backward's body, on inputs its op's check has passed (src/ops/op_signatures.h); the
// fused attention's backward calls it directly.
ops::op::Body<ops::op::KnnAggregateBackward> knn_aggregate_backward_checked;

}  // namespace convnn::cpu
