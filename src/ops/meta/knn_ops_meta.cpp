// Meta kernels of the core ops: the shape, dtype and device checks of every backend
// (src/ops/checks.h with Scope::kShapesOnly: a meta or fake tensor has no values to read), then
// outputs with the right shapes and dtypes and no data. They make the ops traceable with fake
// tensors, symbolic sizes included (torch.compile with dynamic shapes, opcheck's
// aot_dispatch_dynamic): sizes are read and built as SymInts only (sym_size, sym_sizes,
// empty_symint), never with sizes(), size(i) or numel(), which throw on symbolic sizes. They are
// also what a call that mixes a meta tensor with a real one reaches, so that its device mismatch is
// reported by name.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "convnn/ops/rho.h"
#include "ops/checks.h"

namespace convnn::meta {
namespace {

constexpr auto kShapesOnly = checks::Scope::kShapesOnly;

at::Tensor empty_if(bool wanted, c10::SymIntArrayRef shape, const at::TensorOptions& options) {
  return wanted ? at::empty_symint(shape, options) : at::Tensor();
}

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, c10::string_view similarity,
                                              const c10::optional<at::Tensor>& mask, bool) {
  checks::check_select_inputs(queries, keys, k, similarity, mask, "knn_select", kShapesOnly);
  const c10::SymInt g = queries.sym_size(0), n = queries.sym_size(1);
  return {at::empty_symint({g, n, k}, queries.options()),
          at::empty_symint({g, n, k}, queries.options().dtype(at::kLong))};
}

std::tuple<at::Tensor, at::Tensor> knn_select_backward(const at::Tensor& grad_scores,
                                                       const at::Tensor& queries,
                                                       const at::Tensor& keys,
                                                       const at::Tensor& indices,
                                                       const at::Tensor& scores,
                                                       c10::string_view similarity) {
  checks::check_select_backward_inputs(grad_scores, queries, keys, indices, scores, similarity,
                                       kShapesOnly);
  return {at::empty_symint(queries.sym_sizes(), queries.options()),
          at::empty_symint(keys.sym_sizes(), keys.options())};
}

at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights,
                         const at::Tensor& indices, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>& bias) {
  checks::check_aggregate_inputs(values, weights, indices, kernel, bias, "knn_aggregate",
                                 kShapesOnly);
  return at::empty_symint({values.sym_size(0), weights.sym_size(1),
                           checks::output_channels_symint(values, kernel)},
                          values.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  checks::check_aggregate_backward_inputs(grad_output, values, weights, indices, kernel,
                                          "knn_aggregate_backward", kShapesOnly);
  const auto& o = values.options();
  return {empty_if(output_mask[0], values.sym_sizes(), o),
          empty_if(output_mask[1], weights.sym_sizes(), o),
          empty_if(output_mask[2], kernel.sym_sizes(), o),
          empty_if(output_mask[3], {checks::output_channels_symint(values, kernel)}, o)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    c10::string_view similarity, const c10::optional<at::Tensor>& mask, bool,
    c10::string_view rho, double temperature) {
  checks::check_attention_inputs(queries, keys, values, kernel, bias, k, similarity, mask, rho,
                                 temperature, "knn_attention", kShapesOnly);
  const c10::SymInt g = queries.sym_size(0), n = queries.sym_size(1);
  const auto slots = queries.options();
  return {at::empty_symint({g, n, checks::output_channels_symint(values, kernel)},
                           values.options()),
          at::empty_symint({g, n, k}, slots), at::empty_symint({g, n, k}, slots.dtype(at::kLong)),
          at::empty_symint({g, n, k}, slots)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward(
    const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, c10::string_view similarity,
    c10::string_view rho, double temperature, std::array<bool, 5> output_mask) {
  const auto checked = checks::check_attention_backward_inputs(
      grad_output, queries, keys, values, kernel, scores, indices, weights, similarity, rho,
      temperature, kShapesOnly);
  // As on every backend: no query or key gradient for a rho that ignores the score values.
  const bool scores_matter = rho_has_score_gradient(checked.rho);
  const auto& o = values.options();
  return {empty_if(output_mask[0] && scores_matter, queries.sym_sizes(), queries.options()),
          empty_if(output_mask[1] && scores_matter, keys.sym_sizes(), keys.options()),
          empty_if(output_mask[2], values.sym_sizes(), o),
          empty_if(output_mask[3], kernel.sym_sizes(), o),
          empty_if(output_mask[4], {checks::output_channels_symint(values, kernel)}, o)};
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
