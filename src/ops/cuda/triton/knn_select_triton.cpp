// knn_select and its backward under the CUDA dispatch key, on the Triton kernels of
// python/convnn/_triton/select.py and pair_gradients.py compiled ahead of time into this library:
// the same kernels and launches as the Python package's, for a LibTorch program with no Python.
// Where they do not apply (float64; K above the widest running top-K; a size past 32 bits; a GPU
// with no fitting image; the first-call check failed; CONVNN_CUDA_KERNELS=generic; the debug
// switch CONVNN_DEVICE_VALUE_CHECKS=1, under which only the generic path can raise on an
// unrankable score) the device-generic path runs, so no legal input is refused.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "ops/checks.h"
#include "ops/cuda/triton/fused_choice.h"
#include "ops/cuda/triton/select_launches.h"
#include "ops/generic/generic.h"

namespace convnn::ops::cuda::triton {
namespace {

std::tuple<at::Tensor, at::Tensor> cuda_select(const at::Tensor& queries, const at::Tensor& keys, int64_t k,
                                               c10::string_view similarity_name,
                                               const c10::optional<at::Tensor>& mask, bool index_order) {
  const auto similarity = checks::check_select_inputs(queries, keys, k, similarity_name, mask);
  const at::Tensor mask_tensor = mask.has_value() ? *mask : at::Tensor();
  const bool applies = fused_kernels_chosen() && fused_dtype(queries.scalar_type()) &&
                       on_one_device(queries, {keys, mask_tensor}) && !checks::reads_values_of(queries) &&
                       select_fits(queries, keys, k) && device_has_select_kernels(queries.get_device()) &&
                       device_verified(queries);
  if (!applies) return generic::knn_select(queries, keys, k, similarity_name, mask, index_order);
  const c10::cuda::CUDAGuard device(queries.device());
  return select_forward(queries.contiguous(), keys.contiguous(), k, similarity, mask_tensor, index_order);
}

std::tuple<at::Tensor, at::Tensor> cuda_select_backward(const at::Tensor& grad_scores, const at::Tensor& queries,
                                                        const at::Tensor& keys, const at::Tensor& indices,
                                                        const at::Tensor& scores, c10::string_view similarity_name) {
  const auto similarity =
      checks::check_select_backward_inputs(grad_scores, queries, keys, indices, scores, similarity_name);
  const int64_t k = indices.size(2);
  // The dot products go through the aggregation kernels: their limits too.
  const bool dot_product = similarity == Similarity::Dot || similarity == Similarity::ScaledDot;
  const auto ones_like_kernel = at::empty({queries.size(2), k}, queries.options().device(at::kMeta));
  const bool applies =
      fused_kernels_chosen() && fused_dtype(queries.scalar_type()) &&
      on_one_device(queries, {grad_scores, keys, indices, scores}) && select_fits(queries, keys, k) &&
      (!dot_product || aggregate_fits(keys, grad_scores, ones_like_kernel)) &&
      device_has_select_kernels(queries.get_device()) &&
      device_has_aggregate_kernels(queries.get_device(), queries.scalar_type()) && device_verified(queries);
  if (!applies) {
    return generic::knn_select_backward(grad_scores, queries, keys, indices, scores, similarity_name);
  }
  const c10::cuda::CUDAGuard device(queries.device());
  return select_backward(grad_scores.contiguous(), queries.contiguous(), keys.contiguous(), indices.contiguous(),
                         scores.contiguous(), similarity);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, CUDA, m) {
  m.impl("knn_select", &cuda_select);
  m.impl("knn_select_backward", &cuda_select_backward);
}

}  // namespace convnn::ops::cuda::triton
