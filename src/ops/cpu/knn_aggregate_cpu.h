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

// knn_aggregate_backward's body, on inputs its op's check has passed (src/ops/op_signatures.h); the
// fused attention's backward calls it directly.
ops::op::Body<ops::op::KnnAggregateBackward> knn_aggregate_backward_checked;

}  // namespace convnn::cpu
