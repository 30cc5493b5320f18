// knn_aggregate and knn_aggregate_backward under the Meta key (src/ops/meta/meta_kernels.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/meta/meta_kernels.h"

namespace convnn::meta {
namespace {

at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights,
                         const at::Tensor& indices, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>&) {
  return at::empty_symint({values.sym_size(0), weights.sym_size(1),
                           checks::output_channels_symint(values, kernel)},
                          values.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor&, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  const auto& o = values.options();
  return {empty_if(output_mask[0], values.sym_sizes(), o),
          empty_if(output_mask[1], weights.sym_sizes(), o),
          empty_if(output_mask[2], kernel.sym_sizes(), o),
          empty_if(output_mask[3], {checks::output_channels_symint(values, kernel)}, o)};
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, Meta, m) {
  implement_meta<op::KnnAggregate, &knn_aggregate>(m);
  implement_meta<op::KnnAggregateBackward, &knn_aggregate_backward>(m);
}

}  // namespace convnn::meta
