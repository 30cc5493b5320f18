// convnn::knn_attention_device_fused, knn_attention_rho_aggregate_device_fused,
// knn_attention_softmax_scores_gradient_device_fused and knn_attention_backward_device_fused under
// the CUDA dispatch key: the fused knn_attention forward, the composed forward's rho and aggregation
// after its select, its backward's softmax scores gradient and its two-kernel backward, the Triton kernels of
// python/convnn/_triton/attention.py and attention_backward.py, over the route that serves the call
// (routes.h). The CUDA knn_attention and its backward (src/ops/composite/knn_attention_composed.cpp)
// ask them first; each is registered behind its op's check (src/ops/op_signatures.h), which is then
// the call's one check. Where the kernels do not apply (path_choice.h says why: a
// standard kernel, float64, K above the widest running top-K, a size past 32 bits, no route, the
// first-call check failed, CONVNN_CUDA_KERNELS=generic, the debug switch
// CONVNN_DEVICE_VALUE_CHECKS=1) they answer with no tensors and the caller composes the core ops. So
// does the forward where knn_select scores on tensor cores (CONVNN_SELECT_SCORES=tensor_cores, issue
// 41): its running top-K scores every pair in IEEE float32, the composition only the candidates that
// the tensor-core scores' bounds cannot rule out (the same indices and scores, bit for bit).
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <vector>

#include "ops/checks.h"
#include "ops/cuda/triton/attention_launches.h"
#include "ops/cuda/triton/path_choice.h"
#include "ops/cuda/triton/select_launches.h"
#include "ops/op_signatures.h"
#include "ops/unit_stride_rows.h"

namespace convnn::ops::cuda::triton {
namespace {

std::vector<at::Tensor> cuda_attention_fused(const checks::AttentionChecked& checked, const at::Tensor& queries,
                                             const at::Tensor& keys, const at::Tensor& values,
                                             const at::Tensor& kernel, const c10::optional<at::Tensor>& bias,
                                             int64_t k, c10::string_view, const c10::optional<at::Tensor>& mask,
                                             bool index_order, c10::string_view, double temperature) {
  const at::Tensor mask_tensor = mask.has_value() ? *mask : at::Tensor();
  const at::Tensor bias_tensor = bias.has_value() ? *bias : at::Tensor();
  auto rules = PathRules(queries, {keys, values, kernel, bias_tensor, mask_tensor})
                   .require(kernel.dim() == 2, "a standard kernel [C',C,K] (the fused forward takes a "
                                               "depthwise [C,K]; the core ops compose)")
                   .require(!device_value_checks(), "CONVNN_DEVICE_VALUE_CHECKS=1")
                   .require(attention_fits(queries, keys, values, kernel, k),
                            "K, a size or a grid past the fused kernel's limits (K <= 64, 32-bit sizes)");
  // Asked only where the kernel would take the call (it may convert a dtype to read the rows' layout).
  rules.require(!(rules.holds() && select_on_tensor_cores(queries, keys, k, checked.similarity, mask_tensor)),
                "knn_select scores this call on tensor cores (CONVNN_SELECT_SCORES=tensor_cores; the fused "
                "forward scores in IEEE float32): knn_select, rho and knn_aggregate compose");
  const auto path = rules.choose_per_dtype("knn_attention", "attention", &attention_kernel_keys);
  if (!path.fused()) return {};
  const c10::OptionalDeviceGuard device(queries.device());
  // [G,N,D] or [B,H,N,D] inputs, read in place (the launcher copies only rows that are not unit-stride).
  auto [output, scores, indices, weights] =
      attention_forward(queries, keys, values, kernel.contiguous(),
                        bias_tensor.defined() ? bias_tensor.contiguous() : bias_tensor, k, checked.similarity,
                        mask_tensor, index_order, checked.rho, temperature, path.run);
  return {output, scores, indices, weights};
}

std::vector<at::Tensor> cuda_rho_aggregate(const Rho& rho, const at::Tensor& scores, const at::Tensor& indices,
                                           const at::Tensor& values, const at::Tensor& kernel,
                                           const c10::optional<at::Tensor>& bias, c10::string_view,
                                           double temperature) {
  const at::Tensor bias_tensor = bias.has_value() ? *bias : at::Tensor();
  const auto path = PathRules(values, {scores, indices, kernel, bias_tensor})
                        .require(rho_aggregate_fits(scores, values, kernel),
                                 "a standard kernel [C',C,K], K above 64, a size past 32 bits or more slices than "
                                 "CUDA's grid (the rho and aggregation kernel's limits)")
                        .choose_per_dtype("knn_attention (rho and aggregation)", "attention rho aggregate",
                                          &rho_aggregate_kernel_keys);
  if (!path.fused()) return {};
  const c10::OptionalDeviceGuard device(values.device());
  auto [output, weights] = rho_aggregate(scores, indices, values, kernel, bias_tensor, rho, temperature, path.run);
  return {output, weights};
}

std::vector<at::Tensor> cuda_softmax_scores_gradient(const at::Tensor& grad_output, const at::Tensor& values,
                                                     const at::Tensor& weights, const at::Tensor& indices,
                                                     const at::Tensor& kernel, double temperature) {
  const auto path = PathRules(values, {grad_output, weights, indices, kernel})
                        .require(scores_gradient_fits(grad_output, values, weights, kernel),
                                 "a standard kernel, K above 64 or a size past 32 bits (the softmax scores gradient "
                                 "kernel's limits)")
                        .choose_per_dtype("knn_attention_backward (softmax scores gradient)",
                                          "attention softmax scores gradient", &scores_gradient_kernel_keys);
  if (!path.fused()) return {};
  const c10::OptionalDeviceGuard device(values.device());
  return {softmax_scores_gradient(unit_stride_rows(grad_output), unit_stride_rows(values), weights.contiguous(),
                                  indices.contiguous(), kernel.contiguous(), temperature, path.run)};
}

std::vector<at::Tensor> cuda_attention_backward_fused(const checks::AttentionChecked& checked,
                                                      const at::Tensor& grad_output, const at::Tensor& queries,
                                                      const at::Tensor& keys, const at::Tensor& values,
                                                      const at::Tensor& kernel, const at::Tensor& scores,
                                                      const at::Tensor& indices, const at::Tensor& weights,
                                                      c10::string_view, c10::string_view, double temperature) {
  const auto path =
      PathRules(queries, {grad_output, keys, values, kernel, scores, indices, weights})
          .require(attention_backward_fits(queries, keys, values, kernel, scores, checked.similarity, checked.rho),
                   "not softmax rho with dot or scaled_dot and a depthwise kernel, K <= 64 and 32-bit sizes (the "
                   "two-kernel backward's cases; the others compose)")
          .choose_per_dtype("knn_attention_backward", "attention backward", &attention_backward_kernel_keys);
  if (!path.fused()) return {};
  const c10::OptionalDeviceGuard device(queries.device());
  // grad_output, queries, keys and values read in place ([G,N,D] or [B,H,N,D], unit-stride rows).
  return attention_backward(unit_stride_rows(grad_output), unit_stride_rows(queries), unit_stride_rows(keys),
                            unit_stride_rows(values), kernel.contiguous(), scores.contiguous(), indices.contiguous(),
                            weights.contiguous(), checked.similarity, temperature, path.run);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, CUDA, m) {
  op::implement_checked<op::KnnAttentionDeviceFused, &cuda_attention_fused>(m);
  op::implement_checked<op::KnnAttentionRhoAggregateDeviceFused, &cuda_rho_aggregate>(m);
  op::implement_checked<op::KnnAttentionSoftmaxScoresGradientDeviceFused, &cuda_softmax_scores_gradient>(m);
  op::implement_checked<op::KnnAttentionBackwardDeviceFused, &cuda_attention_backward_fused>(m);
}

}  // namespace convnn::ops::cuda::triton
