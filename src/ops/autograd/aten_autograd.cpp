// The core ops differentiated by ATen's autograd (aten_autograd.h says when and why).
#include "ops/autograd/aten_autograd.h"

#include <ATen/ATen.h>
#include <ATen/functorch/DynamicLayer.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "ops/checks.h"
#include "ops/reference/reference.h"

namespace convnn::autograd {
namespace {

// What autograd::grad differentiates for one input: the input itself where it requires grad (so
// the result stays connected to the graph upstream of it), a fresh leaf with its values where it
// does not but its gradient is asked for, and nothing otherwise.
at::Tensor differentiation_handle(const at::Tensor& t, bool wanted) {
  if (!t.defined() || !wanted || t.requires_grad()) return t;
  return t.detach().requires_grad_(true);
}

// <output, grad_output> differentiated with respect to each wanted handle, with a graph, so the
// result is differentiable again (with respect to grad_output too). An input the output does not
// depend on gets an undefined gradient, which autograd reads as zero: the true derivative.
std::vector<at::Tensor> gradients_with_graph(const at::Tensor& output, const at::Tensor& grad_output,
                                             const std::vector<at::Tensor>& handles,
                                             const std::vector<bool>& wanted) {
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < handles.size(); ++i) {
    if (wanted[i] && handles[i].defined()) inputs.push_back(handles[i]);
  }
  std::vector<at::Tensor> result(handles.size());
  if (inputs.empty() || !output.requires_grad()) return result;
  const auto grads = torch::autograd::grad({output}, inputs, {grad_output}, /*retain_graph=*/true,
                                           /*create_graph=*/true, /*allow_unused=*/true);
  size_t next = 0;
  for (size_t i = 0; i < handles.size(); ++i) {
    if (wanted[i] && handles[i].defined()) result[i] = grads[next++];
  }
  return result;
}

// The scores knn_select reported, recomputed from the inputs for the selected pairs: masked slots
// (-inf) stay constant, every other slot is the similarity of its pair.
at::Tensor scores_of_selection(const at::Tensor& queries, const at::Tensor& keys,
                               const at::Tensor& indices, const at::Tensor& scores,
                               Similarity similarity) {
  const auto masked = at::isneginf(scores.detach());
  const auto recomputed = reference::selected_scores(queries, keys, indices, similarity);
  return at::where(masked, scores.detach(), recomputed);
}

at::Tensor bias_gradient(const at::Tensor& grad_output) {
  return grad_output.sum(std::vector<int64_t>{0, 1});
}

}  // namespace

bool needs_aten_autograd(std::initializer_list<at::Tensor> inputs) {
  if (at::functorch::maybeCurrentDynamicLayer().has_value()) return true;
  for (const auto& t : inputs) {
    if (t.defined() && t._fw_grad(/*level=*/0).defined()) return true;
  }
  return false;
}

bool builds_a_graph(std::initializer_list<at::Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const auto& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

std::tuple<at::Tensor, at::Tensor> knn_select_aten_checked(const Similarity& similarity, const at::Tensor& queries,
                                                           const at::Tensor& keys, int64_t k, c10::string_view,
                                                           const c10::optional<at::Tensor>& mask, bool index_order) {
  return reference::knn_select(queries, keys, k, similarity, mask, index_order);
}

at::Tensor knn_aggregate_aten_checked(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                                      const at::Tensor& kernel, const c10::optional<at::Tensor>& bias) {
  return reference::knn_aggregate(values, weights, indices, kernel, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_aten_checked(
    const checks::AttentionChecked& checked, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    c10::string_view, const c10::optional<at::Tensor>& mask, bool index_order, c10::string_view,
    double temperature) {
  auto [output, scores, indices, weights] =
      reference::knn_attention(queries, keys, values, kernel, bias, k, checked.similarity, mask,
                               index_order, checked.rho, temperature);
  return {output, scores.detach(), indices, weights.detach()};
}

std::tuple<at::Tensor, at::Tensor> knn_select_backward_aten_checked(
    const Similarity& checked, const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& indices, const at::Tensor& scores, c10::string_view) {
  const std::vector<bool> wanted{true, true};
  const std::vector<at::Tensor> handles{differentiation_handle(queries, true),
                                        differentiation_handle(keys, true)};
  const auto recomputed = scores_of_selection(handles[0], handles[1], indices, scores, checked);
  auto grads = gradients_with_graph(recomputed, grad_scores, handles, wanted);
  return {grads[0], grads[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward_aten_checked(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  const std::vector<bool> wanted{output_mask[0], output_mask[1], output_mask[2]};
  const std::vector<at::Tensor> handles{differentiation_handle(values, wanted[0]),
                                        differentiation_handle(weights, wanted[1]),
                                        differentiation_handle(kernel, wanted[2])};
  const auto output = reference::knn_aggregate(handles[0], handles[1], indices, handles[2], c10::nullopt);
  auto grads = gradients_with_graph(output, grad_output, handles, wanted);
  return {grads[0], grads[1], grads[2], output_mask[3] ? bias_gradient(grad_output) : at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward_aten_checked(
    const checks::AttentionChecked& checked, const at::Tensor& grad_output, const at::Tensor& queries,
    const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, c10::string_view, c10::string_view, double temperature,
    std::array<bool, 5> output_mask) {
  const std::vector<bool> wanted{output_mask[0], output_mask[1], output_mask[2], output_mask[3]};
  std::vector<at::Tensor> handles;
  for (size_t i = 0; i < wanted.size(); ++i) {
    handles.push_back(differentiation_handle(std::array{queries, keys, values, kernel}[i], wanted[i]));
  }
  const auto recomputed_scores =
      scores_of_selection(handles[0], handles[1], indices, scores, checked.similarity);
  const auto recomputed_weights = reference::rho_weights(recomputed_scores, checked.rho, temperature);
  const auto output =
      reference::knn_aggregate(handles[2], recomputed_weights, indices, handles[3], c10::nullopt);
  auto grads = gradients_with_graph(output, grad_output, handles, wanted);
  return {grads[0], grads[1], grads[2], grads[3],
          output_mask[4] ? bias_gradient(grad_output) : at::Tensor()};
}

}  // namespace convnn::autograd
