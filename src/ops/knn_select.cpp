// convnn::knn_select: schema and the C++ entry point, which goes through the dispatcher so that the
// Autograd, CPU and CUDA kernels are chosen by the inputs.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "convnn/ops/knn_ops.h"

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  m.def("knn_select(Tensor queries, Tensor keys, int k, str similarity, Tensor? mask, "
        "bool index_order) -> (Tensor scores, Tensor indices)");
  m.def("knn_select_backward(Tensor grad_scores, Tensor queries, Tensor keys, Tensor indices, "
        "Tensor scores, str similarity) -> (Tensor grad_queries, Tensor grad_keys)");
}

namespace convnn::ops {

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, const std::string& similarity,
                                              const c10::optional<at::Tensor>& mask,
                                              bool index_order) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("convnn::knn_select", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, int64_t, c10::string_view,
                           const c10::optional<at::Tensor>&, bool)>();
  // The dispatcher needs a device from every tensor; say which one is missing before it asks.
  TORCH_CHECK(queries.defined(), "knn_select: queries must be a defined tensor");
  TORCH_CHECK(keys.defined(), "knn_select: keys must be a defined tensor");
  return op.call(queries, keys, k, similarity, mask, index_order);
}

std::tuple<at::Tensor, at::Tensor> knn_select_backward(const at::Tensor& grad_scores,
                                                       const at::Tensor& queries,
                                                       const at::Tensor& keys,
                                                       const at::Tensor& indices,
                                                       const at::Tensor& scores,
                                                       const std::string& similarity) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("convnn::knn_select_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(grad_scores, queries, keys, indices, scores, similarity);
}

}  // namespace convnn::ops
