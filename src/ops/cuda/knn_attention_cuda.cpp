// knn_attention and its backward under the CUDA dispatch key: the device-neutral choice of
// src/ops/composite/knn_attention_composed.h (the fused Triton kernels where they take the inputs,
// else the composition of the core ops' CUDA kernels, else the device-generic path). Registered in
// every build; a new device with core kernels of its own adds the same two lines.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <array>
#include <tuple>

#include "ops/composite/knn_attention_composed.h"
#include "ops/op_signatures.h"

namespace convnn::ops::cuda {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cuda_attention(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel,
    const c10::optional<at::Tensor>& bias, int64_t k, c10::string_view similarity,
    const c10::optional<at::Tensor>& mask, bool index_order, c10::string_view rho, double temperature) {
  return composite::device_attention(c10::DispatchKey::CUDA, queries, keys, values, kernel, bias, k, similarity, mask,
                                     index_order, rho, temperature);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> cuda_attention_backward(
    const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const at::Tensor& scores, const at::Tensor& indices, const at::Tensor& weights,
    c10::string_view similarity, c10::string_view rho, double temperature, std::array<bool, 5> output_mask) {
  return composite::device_attention_backward(c10::DispatchKey::CUDA, grad_output, queries, keys, values, kernel,
                                              scores, indices, weights, similarity, rho, temperature, output_mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, CUDA, m) {
  op::implement<op::KnnAttention>(m, &cuda_attention);
  op::implement<op::KnnAttentionBackward>(m, &cuda_attention_backward);
}

}  // namespace convnn::ops::cuda
