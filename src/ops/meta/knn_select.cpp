// knn_select and knn_select_backward under the Meta key (src/ops/meta/meta_kernels.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/meta/meta_kernels.h"

namespace convnn::meta {
namespace {

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

}  // namespace

TORCH_LIBRARY_IMPL(convnn, Meta, m) {
  m.impl("knn_select", &knn_select);
  m.impl("knn_select_backward", &knn_select_backward);
}

}  // namespace convnn::meta
