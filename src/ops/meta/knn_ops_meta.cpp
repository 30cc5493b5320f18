// Meta kernels of the core ops: the same input checks as every backend (src/ops/checks.h, which
// skip the value checks on meta tensors), then outputs with the right shapes and dtypes and no
// data. They make the ops traceable with fake tensors, and they are what a call that mixes a meta
// tensor with a real one reaches, so that its device mismatch is reported by name.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "convnn/ops/rho.h"
#include "ops/checks.h"

namespace convnn::meta {
namespace {

at::Tensor empty_if(bool wanted, c10::IntArrayRef shape, const at::TensorOptions& options) {
  return wanted ? at::empty(shape, options) : at::Tensor();
}

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, c10::string_view similarity,
                                              const c10::optional<at::Tensor>& mask, bool) {
  checks::check_select_inputs(queries, keys, k, similarity, mask);
  const int64_t g = queries.size(0), n = queries.size(1);
  return {at::empty({g, n, k}, queries.options()),
          at::empty({g, n, k}, queries.options().dtype(at::kLong))};
}

std::tuple<at::Tensor, at::Tensor> knn_select_backward(const at::Tensor& grad_scores,
                                                       const at::Tensor& queries,
                                                       const at::Tensor& keys,
                                                       const at::Tensor& indices,
                                                       const at::Tensor& scores,
                                                       c10::string_view similarity) {
  checks::check_select_backward_inputs(grad_scores, queries, keys, indices, scores, similarity);
  return {at::empty_like(queries, at::MemoryFormat::Contiguous),
          at::empty_like(keys, at::MemoryFormat::Contiguous)};
}

at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights,
                         const at::Tensor& indices, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>& bias) {
  checks::check_aggregate_inputs(values, weights, indices, kernel, bias);
  return at::empty({values.size(0), weights.size(1), checks::output_channels(values, kernel)},
                   values.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  checks::check_aggregate_backward_inputs(grad_output, values, weights, indices, kernel);
  const auto& o = values.options();
  return {empty_if(output_mask[0], values.sizes(), o), empty_if(output_mask[1], weights.sizes(), o),
          empty_if(output_mask[2], kernel.sizes(), o),
          empty_if(output_mask[3], {checks::output_channels(values, kernel)}, o)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    c10::string_view similarity, const c10::optional<at::Tensor>& mask, bool,
    c10::string_view rho, double temperature) {
  checks::check_attention_inputs(queries, keys, values, kernel, bias, k, similarity, mask, rho,
                                 temperature);
  const int64_t g = queries.size(0), n = queries.size(1);
  const auto slots = queries.options();
  return {at::empty({g, n, checks::output_channels(values, kernel)}, values.options()),
          at::empty({g, n, k}, slots), at::empty({g, n, k}, slots.dtype(at::kLong)),
          at::empty({g, n, k}, slots)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward(
    const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, c10::string_view similarity,
    c10::string_view rho, double temperature, std::array<bool, 5> output_mask) {
  const auto checked = checks::check_attention_backward_inputs(
      grad_output, queries, keys, values, kernel, scores, indices, weights, similarity, rho,
      temperature);
  // As on every backend: no query or key gradient for a rho that ignores the score values.
  const bool scores_matter = rho_has_score_gradient(checked.rho);
  const auto& o = values.options();
  return {empty_if(output_mask[0] && scores_matter, queries.sizes(), queries.options()),
          empty_if(output_mask[1] && scores_matter, keys.sizes(), keys.options()),
          empty_if(output_mask[2], values.sizes(), o), empty_if(output_mask[3], kernel.sizes(), o),
          empty_if(output_mask[4], {checks::output_channels(values, kernel)}, o)};
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, Meta, m) {
  m.impl("knn_select", &knn_select);
  m.impl("knn_select_backward", &knn_select_backward);
  m.impl("knn_aggregate", &knn_aggregate);
  m.impl("knn_aggregate_backward", &knn_aggregate_backward);
  m.impl("knn_attention", &knn_attention);
  m.impl("knn_attention_backward", &knn_attention_backward);
}

}  // namespace convnn::meta
