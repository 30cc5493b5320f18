#pragma once
// knn_attention's backward as a composition, the same on every device: the aggregation's backward
// gives d(values), d(kernel), d(bias) and d(weights); the softmax-rho backward turns d(weights) into
// d(scores); the select backward turns d(scores) into d(queries) and d(keys). Each implementation
// (fused CPU, device-generic) supplies its own three steps, so a direct call of one implementation
// stays within it, and a new device writes the steps, not the composition.
#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <array>
#include <tuple>

#include "convnn/ops/rho.h"

namespace convnn::ops::composite {

struct AttentionBackwardSteps {
  // (grad_values, grad_weights, grad_kernel, grad_bias), as knn_aggregate_backward.
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> (*aggregate_backward)(
      const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
      const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask);
  // d(scores) [G,N,K] from the softmax weights and d(weights), in the scores' dtype.
  at::Tensor (*softmax_rho_backward)(const at::Tensor& weights, const at::Tensor& grad_weights,
                                     double temperature);
  // (grad_queries, grad_keys), as knn_select_backward.
  std::tuple<at::Tensor, at::Tensor> (*select_backward)(
      const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& keys,
      const at::Tensor& indices, const at::Tensor& scores, c10::string_view similarity);
  // Optional: d(scores) for softmax rho straight from grad_output, the aggregation's weights
  // gradient and the softmax-rho backward in one device kernel (d(weights) stays on chip), or an
  // undefined tensor where the device has none for these inputs; the two steps above run then.
  at::Tensor (*fused_softmax_scores_gradient)(const at::Tensor& grad_output, const at::Tensor& values,
                                              const at::Tensor& weights, const at::Tensor& indices,
                                              const at::Tensor& kernel, double temperature) = nullptr;
};

// The inputs are already checked (src/ops/checks.h, check_attention_backward_inputs); `rho` is the
// checked rho. Returns (grad_queries, grad_keys, grad_values, grad_kernel, grad_bias) with the
// entries that output_mask does not ask for undefined; the query and key gradients are undefined
// for rhos without a score gradient.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward(
    const AttentionBackwardSteps& steps, const at::Tensor& grad_output, const at::Tensor& queries,
    const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel,
    const at::Tensor& scores, const at::Tensor& indices, const at::Tensor& weights,
    c10::string_view similarity, Rho rho, double temperature, std::array<bool, 5> output_mask);

}  // namespace convnn::ops::composite
