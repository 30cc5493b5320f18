// knn_select and its backward under the CUDA dispatch key, on the Triton kernels of
// python/convnn/_triton/select.py and pair_gradients.py, over the route that serves the call
// (routes.h: the images embedded in this library, or the Python package's launcher). Where they do
// not apply (path_choice.h says why: float64; K above the widest running top-K; a size past 32
// bits; no route; the first-call check failed; CONVNN_CUDA_KERNELS=generic; the debug switch
// CONVNN_DEVICE_VALUE_CHECKS=1, under which only the generic path can raise on an unrankable
// score) the device-generic path runs, so no legal input is refused.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <tuple>

#include "ops/checks.h"
#include "ops/cuda/triton/path_choice.h"
#include "ops/cuda/triton/select_launches.h"
#include "ops/generic/generic.h"
#include "ops/op_signatures.h"

namespace convnn::ops::cuda::triton {
namespace {

constexpr const char* kTooWide = "K, a size or a grid past the select kernels' limits (K <= 64, 32-bit sizes)";

std::tuple<at::Tensor, at::Tensor> cuda_select(const Similarity& similarity, const at::Tensor& queries,
                                               const at::Tensor& keys, int64_t k, c10::string_view similarity_name,
                                               const c10::optional<at::Tensor>& mask, bool index_order) {
  const at::Tensor mask_tensor = mask.has_value() ? *mask : at::Tensor();
  const auto path = PathRules(queries, {keys, mask_tensor})
                        .require(!device_value_checks(), "CONVNN_DEVICE_VALUE_CHECKS=1")
                        .require(select_fits(queries, keys, k), kTooWide)
                        .choose_per_dtype("knn_select", "select", &select_kernel_keys);
  if (!path.fused()) {
    return generic::knn_select_checked(similarity, queries, keys, k, similarity_name, mask, index_order);
  }
  const c10::OptionalDeviceGuard device(queries.device());
  // Queries and keys read in place (the launcher copies only rows that are not unit-stride).
  return select_forward(queries, keys, k, similarity, mask_tensor, index_order, path.run);
}

std::tuple<at::Tensor, at::Tensor> cuda_select_backward(const Similarity& similarity, const at::Tensor& grad_scores,
                                                        const at::Tensor& queries, const at::Tensor& keys,
                                                        const at::Tensor& indices, const at::Tensor& scores,
                                                        c10::string_view similarity_name) {
  const int64_t k = indices.size(2);
  // The dot products go through the aggregation kernels: their limits and kernels too.
  const auto ones_like_kernel = at::empty({queries.size(2), k}, queries.options().device(at::kMeta));
  PathRules rules(queries, {grad_scores, keys, indices, scores});
  rules.require(select_fits(queries, keys, k), kTooWide)
      .require(!is_dot_product(similarity) || aggregate_fits(keys, grad_scores, ones_like_kernel),
               "a size or grid past the aggregation kernels' 32-bit limits");
  const auto path = rules.choose_per_dtype("knn_select_backward", "select backward", &select_backward_kernel_keys);
  if (!path.fused()) {
    return generic::knn_select_backward_checked(similarity, grad_scores, queries, keys, indices, scores,
                                                similarity_name);
  }
  const c10::OptionalDeviceGuard device(queries.device());
  return select_backward(grad_scores.contiguous(), queries.contiguous(), keys.contiguous(), indices.contiguous(),
                         scores.contiguous(), similarity, path.run);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, CUDA, m) {
  op::implement_checked<op::KnnSelect, &cuda_select>(m);
  op::implement_checked<op::KnnSelectBackward, &cuda_select_backward>(m);
}

}  // namespace convnn::ops::cuda::triton
