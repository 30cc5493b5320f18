// knn_select and knn_select_backward under the Meta key (src/ops/meta/meta_kernels.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/meta/meta_kernels.h"

namespace convnn::meta {
namespace {

std::tuple<at::Tensor, at::Tensor> knn_select(const Similarity&, const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, c10::string_view, const c10::optional<at::Tensor>&, bool) {
  const c10::SymInt g = queries.sym_size(0), n = queries.sym_size(1);
  return {at::empty_symint({g, n, k}, queries.options()),
          at::empty_symint({g, n, k}, queries.options().dtype(at::kLong))};
}

std::tuple<at::Tensor, at::Tensor> knn_select_backward(const Similarity&, const at::Tensor&, const at::Tensor& queries,
                                                       const at::Tensor& keys, const at::Tensor&, const at::Tensor&,
                                                       c10::string_view) {
  return {at::empty_symint(queries.sym_sizes(), queries.options()),
          at::empty_symint(keys.sym_sizes(), keys.options())};
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, Meta, m) {
  implement_meta<op::KnnSelect, &knn_select>(m);
  implement_meta<op::KnnSelectBackward, &knn_select_backward>(m);
}

}  // namespace convnn::meta
