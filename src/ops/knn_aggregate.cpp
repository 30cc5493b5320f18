// convnn::knn_aggregate: schema and the C++ entry point through the dispatcher.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "convnn/ops/knn_ops.h"

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  m.def("knn_aggregate(Tensor values, Tensor weights, Tensor indices, Tensor kernel, "
        "Tensor? bias) -> Tensor");
  m.def("knn_aggregate_backward(Tensor grad_output, Tensor values, Tensor weights, "
        "Tensor indices, Tensor kernel, bool[4] output_mask) -> (Tensor grad_values, "
        "Tensor grad_weights, Tensor grad_kernel, Tensor grad_bias)");
}

namespace convnn::ops {

at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights,
                         const at::Tensor& indices, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>& bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("convnn::knn_aggregate", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const c10::optional<at::Tensor>&)>();
  // The dispatcher needs a device from every tensor; say which one is missing before it asks.
  TORCH_CHECK(values.defined(), "knn_aggregate: values must be a defined tensor");
  TORCH_CHECK(weights.defined(), "knn_aggregate: weights must be a defined tensor");
  TORCH_CHECK(indices.defined(), "knn_aggregate: indices must be a defined tensor");
  TORCH_CHECK(kernel.defined(), "knn_aggregate: kernel must be a defined tensor");
  return op.call(values, weights, indices, kernel, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("convnn::knn_aggregate_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&, std::array<bool, 4>)>();
  return op.call(grad_output, values, weights, indices, kernel, output_mask);
}

}  // namespace convnn::ops
