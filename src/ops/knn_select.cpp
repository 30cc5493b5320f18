// convnn::knn_select: schema and the C++ entry point, which goes through the dispatcher so that the
// Autograd, CPU and CUDA kernels are chosen by the inputs.
#include "convnn/ops/knn_ops.h"
#include "ops/op_signatures.h"

TORCH_LIBRARY_FRAGMENT(convnn, m) {
  convnn::ops::op::define<convnn::ops::op::KnnSelect>(m);
  convnn::ops::op::define<convnn::ops::op::KnnSelectBackward>(m);
}

namespace convnn::ops {

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, const std::string& similarity,
                                              const c10::optional<at::Tensor>& mask,
                                              bool index_order) {
  const auto& dispatched = op::handle<op::KnnSelect>();
  // The dispatcher needs a device from every tensor; say which one is missing before it asks.
  TORCH_CHECK(queries.defined(), "knn_select: queries must be a defined tensor");
  TORCH_CHECK(keys.defined(), "knn_select: keys must be a defined tensor");
  return dispatched.call(queries, keys, k, similarity, mask, index_order);
}

std::tuple<at::Tensor, at::Tensor> knn_select_backward(const at::Tensor& grad_scores,
                                                       const at::Tensor& queries,
                                                       const at::Tensor& keys,
                                                       const at::Tensor& indices,
                                                       const at::Tensor& scores,
                                                       const std::string& similarity) {
  const auto& dispatched = op::handle<op::KnnSelectBackward>();
  return dispatched.call(grad_scores, queries, keys, indices, scores, similarity);
}

}  // namespace convnn::ops
