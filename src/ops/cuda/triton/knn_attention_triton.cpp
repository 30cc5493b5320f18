// convnn::knn_attention_device_fused, knn_attention_softmax_scores_gradient_device_fused and
// knn_attention_backward_device_fused under the CUDA dispatch key: the fused knn_attention forward,
// its backward's softmax scores gradient and its two-kernel backward, the Triton kernels of
// python/convnn/_triton/attention.py and attention_backward.py compiled ahead of time into this library
// (the same kernel and launch as the Python package's). The CUDA knn_attention
// (src/ops/cuda/knn_attention_composed.cpp) asks it first, after its checks; where the kernel does not apply
// (a standard kernel, float64, K above the widest running top-K, a size past 32 bits, a GPU with no
// fitting image, the first-call check failed, CONVNN_CUDA_KERNELS=generic, the debug switch
// CONVNN_DEVICE_VALUE_CHECKS=1) it answers with no tensors and knn_attention composes the core ops.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <vector>

#include "ops/checks.h"
#include "ops/cuda/triton/attention_launches.h"
#include "ops/cuda/triton/fused_choice.h"

namespace convnn::ops::cuda::triton {
namespace {

std::vector<at::Tensor> cuda_attention_fused(const at::Tensor& queries, const at::Tensor& keys,
                                             const at::Tensor& values, const at::Tensor& kernel,
                                             const c10::optional<at::Tensor>& bias, int64_t k,
                                             c10::string_view similarity_name, const c10::optional<at::Tensor>& mask,
                                             bool index_order, c10::string_view rho_name, double temperature) {
  const auto checked = checks::check_attention_inputs(queries, keys, values, kernel, bias, k, similarity_name, mask,
                                                      rho_name, temperature);
  const at::Tensor mask_tensor = mask.has_value() ? *mask : at::Tensor();
  const at::Tensor bias_tensor = bias.has_value() ? *bias : at::Tensor();
  const auto dtype = queries.scalar_type();
  const bool applies = fused_kernels_chosen() && fused_dtype(dtype) &&
                       on_one_device(queries, {keys, values, kernel, bias_tensor, mask_tensor}) &&
                       !checks::reads_values_of(queries) && attention_fits(queries, keys, values, kernel, k) &&
                       device_has_attention_kernels(queries.get_device()) && device_verified(queries);
  if (!applies) return {};
  const c10::cuda::CUDAGuard device(queries.device());
  auto [output, scores, indices, weights] =
      attention_forward(queries.contiguous(), keys.contiguous(), values.contiguous(), kernel.contiguous(),
                        bias_tensor.defined() ? bias_tensor.contiguous() : bias_tensor, k, checked.similarity,
                        mask_tensor, index_order, checked.rho, temperature);
  return {output, scores, indices, weights};
}

std::vector<at::Tensor> cuda_softmax_scores_gradient(const at::Tensor& grad_output, const at::Tensor& values,
                                                     const at::Tensor& weights, const at::Tensor& indices,
                                                     const at::Tensor& kernel, double temperature) {
  checks::check_aggregate_backward_inputs(grad_output, values, weights, indices, kernel);
  const bool applies = fused_kernels_chosen() && fused_dtype(values.scalar_type()) &&
                       on_one_device(values, {grad_output, weights, indices, kernel}) &&
                       scores_gradient_fits(grad_output, values, weights, kernel) &&
                       device_has_scores_gradient_kernels(values.get_device()) && device_verified(values);
  if (!applies) return {};
  const c10::cuda::CUDAGuard device(values.device());
  return {softmax_scores_gradient(grad_output.contiguous(), values.contiguous(), weights.contiguous(),
                                  indices.contiguous(), kernel.contiguous(), temperature)};
}

std::vector<at::Tensor> cuda_attention_backward_fused(const at::Tensor& grad_output, const at::Tensor& queries,
                                                      const at::Tensor& keys, const at::Tensor& values,
                                                      const at::Tensor& kernel, const at::Tensor& scores,
                                                      const at::Tensor& indices, const at::Tensor& weights,
                                                      c10::string_view similarity_name, c10::string_view rho_name,
                                                      double temperature) {
  const auto checked = checks::check_attention_backward_inputs(grad_output, queries, keys, values, kernel, scores,
                                                               indices, weights, similarity_name, rho_name,
                                                               temperature);
  const bool applies =
      fused_kernels_chosen() && fused_dtype(queries.scalar_type()) &&
      on_one_device(queries, {grad_output, keys, values, kernel, scores, indices, weights}) &&
      attention_backward_fits(queries, keys, values, kernel, scores, checked.similarity, checked.rho) &&
      device_has_attention_backward_kernels(queries.get_device()) && device_verified(queries);
  if (!applies) return {};
  const c10::cuda::CUDAGuard device(queries.device());
  return attention_backward(grad_output.contiguous(), queries.contiguous(), keys.contiguous(), values.contiguous(),
                            kernel.contiguous(), scores.contiguous(), indices.contiguous(), weights.contiguous(),
                            checked.similarity, temperature);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, CUDA, m) {
  m.impl("knn_attention_device_fused", &cuda_attention_fused);
  m.impl("knn_attention_softmax_scores_gradient_device_fused", &cuda_softmax_scores_gradient);
  m.impl("knn_attention_backward_device_fused", &cuda_attention_backward_fused);
}

}  // namespace convnn::ops::cuda::triton
