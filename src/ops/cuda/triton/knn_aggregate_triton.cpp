// knn_aggregate and its backward under the CUDA dispatch key, on the Triton kernels of
// python/convnn/_triton/aggregate.py, over the route that serves the call (routes.h). Where they do
// not apply (path_choice.h says why: float64; a size past 32 bits; no route; the first-call check
// failed; CONVNN_CUDA_KERNELS=generic) the device-generic path runs, so no legal input is refused.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <initializer_list>
#include <limits>
#include <string>
#include <tuple>

#include "ops/checks.h"
#include "ops/cuda/triton/aggregate_launches.h"
#include "ops/cuda/triton/path_choice.h"
#include "ops/generic/generic.h"
#include "ops/op_signatures.h"

namespace convnn::ops::cuda::triton {
namespace {

// For inputs the op's checks passed.
PathChoice aggregate_path(const char* op, const at::Tensor& values, const at::Tensor& weights,
                          const at::Tensor& kernel, std::initializer_list<at::Tensor> others) {
  PathRules rules(values, others);
  bool within = aggregate_fits(values, weights, kernel);
  for (const auto& t : others) within = within && (!t.defined() || t.numel() <= std::numeric_limits<int32_t>::max());
  rules.require(within, "a size or grid past the aggregation kernels' 32-bit limits");
  return rules.choose_per_dtype(op, "aggregate", &aggregate_kernel_keys);
}

at::Tensor cuda_aggregate(const at::Tensor& values, const at::Tensor& weights, const at::Tensor& indices,
                          const at::Tensor& kernel, const c10::optional<at::Tensor>& bias) {
  const at::Tensor bias_tensor = bias.has_value() ? *bias : at::Tensor();
  const auto path = aggregate_path("knn_aggregate", values, weights, kernel, {weights, indices, kernel, bias_tensor});
  if (!path.fused()) return generic::knn_aggregate_checked(values, weights, indices, kernel, bias);
  const c10::OptionalDeviceGuard device(values.device());
  return aggregate_forward(values.contiguous(), weights.contiguous(), indices.contiguous(), kernel.contiguous(),
                           bias_tensor.defined() ? bias_tensor.contiguous() : bias_tensor, path.run);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cuda_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  const auto path =
      aggregate_path("knn_aggregate_backward", values, weights, kernel, {grad_output, weights, indices, kernel});
  if (!path.fused()) {
    return generic::knn_aggregate_backward_checked(grad_output, values, weights, indices, kernel, output_mask);
  }
  const c10::OptionalDeviceGuard device(values.device());
  return aggregate_backward(grad_output.contiguous(), values.contiguous(), weights.contiguous(),
                            indices.contiguous(), kernel.contiguous(), output_mask, path.run);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, CUDA, m) {
  op::implement_checked<op::KnnAggregate, &cuda_aggregate>(m);
  op::implement_checked<op::KnnAggregateBackward, &cuda_aggregate_backward>(m);
}

}  // namespace convnn::ops::cuda::triton
