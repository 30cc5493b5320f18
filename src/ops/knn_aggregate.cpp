// convnn::knn_aggregate: schema and the C++ entry point through the dispatcher.
#include "convnn/ops/knn_ops.h"
#include "ops/op_signatures.h"

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  convnn::ops::op::define<convnn::ops::op::KnnAggregate>(m);
  convnn::ops::op::define<convnn::ops::op::KnnAggregateBackward>(m);
}

namespace convnn::ops {

at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights,
                         const at::Tensor& indices, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>& bias) {
  const auto& dispatched = op::handle<op::KnnAggregate>();
  // The dispatcher needs a device from every tensor; say which one is missing before it asks.
  TORCH_CHECK(values.defined(), "knn_aggregate: values must be a defined tensor");
  TORCH_CHECK(weights.defined(), "knn_aggregate: weights must be a defined tensor");
  TORCH_CHECK(indices.defined(), "knn_aggregate: indices must be a defined tensor");
  TORCH_CHECK(kernel.defined(), "knn_aggregate: kernel must be a defined tensor");
  return dispatched.call(values, weights, indices, kernel, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  const auto& dispatched = op::handle<op::KnnAggregateBackward>();
  return dispatched.call(grad_output, values, weights, indices, kernel, output_mask);
}

}  // namespace convnn::ops
