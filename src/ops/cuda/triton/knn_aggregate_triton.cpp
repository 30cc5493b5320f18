// knn_aggregate and its backward under the CUDA dispatch key, on the Triton kernels of
// python/convnn/_triton/aggregate.py compiled ahead of time into this library (compiled_kernels.h):
// the same kernels and the same launches as the Python package's (aggregate.aggregate_forward,
// aggregate_backward, inverse_index, kernel_gradient), for a LibTorch program with no Python.
// Where they do not apply (float64; a size past 32 bits; a GPU with no fitting image; the
// first-call check failed; CONVNN_CUDA_KERNELS=generic) the device-generic path runs, so no legal
// input is refused.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <array>
#include <limits>
#include <tuple>

#include "ops/checks.h"
#include "ops/cuda/triton/aggregate_launches.h"
#include "ops/cuda/triton/fused_choice.h"
#include "ops/generic/generic.h"

namespace convnn::ops::cuda::triton {
namespace {

// For inputs the op's checks passed.
bool fused_applies(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& kernel,
                   std::initializer_list<at::Tensor> others) {
  if (!fused_kernels_chosen() || !aggregate_fits(values, weights, kernel)) return false;
  for (const auto& t : others) {
    if (t.defined() && (t.device() != values.device() || t.numel() > std::numeric_limits<int32_t>::max())) {
      return false;
    }
  }
  return device_has_aggregate_kernels(values.get_device(), values.scalar_type()) && device_verified(values);
}

at::Tensor cuda_aggregate(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                          const at::Tensor& kernel, const c10::optional<at::Tensor>& bias) {
  checks::check_aggregate_inputs(values, weights, indices, kernel, bias);
  const at::Tensor bias_tensor = bias.has_value() ? *bias : at::Tensor();
  if (!fused_applies(values, weights, kernel, {indices, bias_tensor})) {
    return generic::knn_aggregate(values, weights, indices, kernel, bias);
  }
  const c10::cuda::CUDAGuard device(values.device());
  return aggregate_forward(values.contiguous(), weights.contiguous(), indices.contiguous(), kernel.contiguous(),
                           bias_tensor.defined() ? bias_tensor.contiguous() : bias_tensor);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cuda_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  checks::check_aggregate_backward_inputs(grad_output, values, weights, indices, kernel);
  if (!fused_applies(values, weights, kernel, {grad_output, indices})) {
    return generic::knn_aggregate_backward(grad_output, values, weights, indices, kernel, output_mask);
  }
  const c10::cuda::CUDAGuard device(values.device());
  return aggregate_backward(grad_output.contiguous(), values.contiguous(), weights.contiguous(),
                            indices.contiguous(), kernel.contiguous(), output_mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, CUDA, m) {
  m.impl("knn_aggregate", &cuda_aggregate);
  m.impl("knn_aggregate_backward", &cuda_aggregate_backward);
}

}  // namespace convnn::ops::cuda::triton
