// CPU kernels of the core ops. Each validates its input with src/ops/checks.h and, until the fused
// kernels land, runs the plain-ATen reference.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/reference/reference.h"

namespace convnn::cpu {
namespace {

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, c10::string_view similarity,
                                              const c10::optional<at::Tensor>& mask,
                                              bool index_order) {
  const auto sim = checks::check_select_inputs(queries, keys, k, similarity, mask);
  return reference::knn_select(queries, keys, k, sim, mask, index_order);
}

std::tuple<at::Tensor, at::Tensor> knn_select_backward(const at::Tensor& grad_scores,
                                                       const at::Tensor& queries,
                                                       const at::Tensor& keys,
                                                       const at::Tensor& indices,
                                                       const at::Tensor& scores,
                                                       c10::string_view similarity) {
  const auto sim = checks::check_select_inputs(queries, keys, indices.size(-1), similarity, {});
  TORCH_CHECK(grad_scores.sizes() == indices.sizes() && scores.sizes() == indices.sizes(),
              "knn_select_backward: grad_scores ", checks::shape_string(grad_scores), ", scores ",
              checks::shape_string(scores), " and indices ", checks::shape_string(indices),
              " must all have the shape [G,N,k]");
  checks::check_indices_in_range(indices, keys.size(1), "knn_select_backward", "indices");
  return reference::knn_select_backward(grad_scores, queries, keys, indices, scores, sim);
}

at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights,
                         const at::Tensor& indices, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>& bias) {
  checks::check_aggregate_inputs(values, weights, indices, kernel, bias);
  return reference::knn_aggregate(values, weights, indices, kernel, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, bool has_bias) {
  checks::check_aggregate_inputs(values, weights, indices, kernel, c10::nullopt);
  const auto c_out = kernel.dim() == 2 ? values.size(2) : kernel.size(0);
  TORCH_CHECK(grad_output.dim() == 3 && grad_output.size(0) == weights.size(0) &&
                  grad_output.size(1) == weights.size(1) && grad_output.size(2) == c_out,
              "knn_aggregate_backward: grad_output must have shape [G,N,C'] = [", weights.size(0),
              ", ", weights.size(1), ", ", c_out, "], got ", checks::shape_string(grad_output));
  return reference::knn_aggregate_backward(grad_output, values, weights, indices, kernel, has_bias);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, CPU, m) {
  m.impl("knn_select", &knn_select);
  m.impl("knn_select_backward", &knn_select_backward);
  m.impl("knn_aggregate", &knn_aggregate);
  m.impl("knn_aggregate_backward", &knn_aggregate_backward);
}

}  // namespace convnn::cpu
