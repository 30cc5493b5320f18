// convnn::knn_aggregate: schema and the C++ entry point through the dispatcher.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "convnn/ops/knn_ops.h"

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  m.def("knn_aggregate(Tensor values, Tensor weights, Tensor indices, Tensor kernel, "
        "Tensor? bias) -> Tensor");
  m.def("knn_aggregate_backward(Tensor grad_output, Tensor values, Tensor weights, "
        "Tensor indices, Tensor kernel, bool has_bias) -> (Tensor grad_values, "
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
  return op.call(values, weights, indices, kernel, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, bool has_bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("convnn::knn_aggregate_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&, bool)>();
  return op.call(grad_output, values, weights, indices, kernel, has_bias);
}

}  // namespace convnn::ops
