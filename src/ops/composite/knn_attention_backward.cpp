#include "ops/composite/knn_attention_backward.h"

namespace convnn::ops::composite {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward(
    const AttentionBackwardSteps& steps, const at::Tensor& grad_output, const at::Tensor& queries,
    const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel,
    const at::Tensor& scores, const at::Tensor& indices, const at::Tensor& weights,
    c10::string_view similarity, Rho rho, double temperature, std::array<bool, 5> output_mask) {
  const auto [want_queries, want_keys, want_values, want_kernel, want_bias] = output_mask;
  // uniform and mean ignore the score values: no query or key gradient, and no d(weights) to pay.
  const bool want_scores = (want_queries || want_keys) && rho_has_score_gradient(rho);
  at::Tensor grad_scores;
  if (want_scores && rho == Rho::Softmax && steps.fused_softmax_scores_gradient != nullptr) {
    grad_scores = steps.fused_softmax_scores_gradient(grad_output, values, weights, indices, kernel, temperature);
  }
  const bool weights_gradient = want_scores && !grad_scores.defined();
  auto [grad_values, grad_weights, grad_kernel, grad_bias] = steps.aggregate_backward(
      grad_output, values, weights, indices, kernel, {want_values, weights_gradient, want_kernel, want_bias});
  at::Tensor grad_queries, grad_keys;
  if (want_scores) {
    if (weights_gradient) grad_scores = steps.softmax_rho_backward(weights, grad_weights, temperature);
    std::tie(grad_queries, grad_keys) =
        steps.select_backward(grad_scores, queries, keys, indices, scores, similarity);
    if (!want_queries) grad_queries = at::Tensor();
    if (!want_keys) grad_keys = at::Tensor();
  }
  return {grad_queries, grad_keys, grad_values, grad_kernel, grad_bias};
}

}  // namespace convnn::ops::composite
