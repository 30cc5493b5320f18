// knn_attention and knn_attention_backward under the Meta key (src/ops/meta/meta_kernels.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "convnn/ops/rho.h"
#include "ops/checks.h"
#include "ops/meta/meta_kernels.h"

namespace convnn::meta {
namespace {

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
  m.impl("knn_attention", &knn_attention);
  m.impl("knn_attention_backward", &knn_attention_backward);
}

}  // namespace convnn::meta
