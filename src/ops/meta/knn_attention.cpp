// knn_attention and knn_attention_backward under the Meta key (src/ops/meta/meta_kernels.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "convnn/ops/rho.h"
#include "ops/meta/meta_kernels.h"

namespace convnn::meta {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const checks::AttentionChecked&, const at::Tensor& queries, const at::Tensor&, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>&, int64_t k, c10::string_view,
    const c10::optional<at::Tensor>&, bool, c10::string_view, double) {
  const c10::SymInt g = queries.sym_size(0), n = queries.sym_size(1);
  const auto slots = queries.options();
  return {at::empty_symint({g, n, checks::output_channels_symint(values, kernel)},
                           values.options()),
          at::empty_symint({g, n, k}, slots), at::empty_symint({g, n, k}, slots.dtype(at::kLong)),
          at::empty_symint({g, n, k}, slots)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward(
    const checks::AttentionChecked& checked, const at::Tensor&, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    c10::string_view, c10::string_view, double, std::array<bool, 5> output_mask) {
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
  implement_meta<op::KnnAttention, &knn_attention>(m);
  implement_meta<op::KnnAttentionBackward, &knn_attention_backward>(m);
}

}  // namespace convnn::meta
