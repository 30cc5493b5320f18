// Reference knn_aggregate, as the paper's Algorithm 1: gather V[I], scale by the weights, and run a
// Conv1d with kernel K and stride K over the concatenated neighbourhoods.
#include <ATen/ATen.h>

#include "ops/reference/indexing.h"
#include "ops/reference/reference.h"

namespace convnn::reference {

at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights,
                         const at::Tensor& indices, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>& bias) {
  const auto g = values.size(0), c = values.size(2);
  const auto n = weights.size(1), k = weights.size(2);
  const bool depthwise = kernel.dim() == 2;
  const auto c_out = depthwise ? c : kernel.size(0);
  if (g == 0 || n == 0 || c == 0) {
    // Nothing to gather (conv1d takes no zero-channel input): every output is the bias.
    const auto empty = at::zeros({g, n, c_out}, values.options());
    return bias.has_value() && bias->defined() ? empty + *bias : empty;
  }
  const auto neighbourhoods = gather_rows(values, indices) * weights.unsqueeze(-1);  // [G,N,K,C]
  const auto x_nn = neighbourhoods.permute({0, 3, 1, 2}).reshape({g, c, n * k});
  const auto conv_weight = depthwise ? kernel.unsqueeze(1) : kernel;
  const std::vector<int64_t> stride{k}, padding{0}, dilation{1};
  const auto y = at::conv1d(x_nn, conv_weight, bias, stride, padding, dilation,
                            /*groups=*/depthwise ? c : 1);
  return y.transpose(1, 2).contiguous();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  const auto [want_values, want_weights, want_kernel, want_bias] = output_mask;
  const auto v_nn = gather_rows(values, indices);  // [G,N,K,C]
  const auto& dy = grad_output;                    // [G,N,C']
  const bool depthwise = kernel.dim() == 2;
  at::Tensor grad_values, grad_weights, grad_kernel, grad_bias;
  if (want_values || want_weights) {
    // dy pulled back through the kernel: [G,N,K,C]
    const auto through_kernel = depthwise
                                    ? dy.unsqueeze(2) * kernel.t().unsqueeze(0).unsqueeze(0)
                                    : at::einsum("gio,ock->gikc", {dy, kernel});
    if (want_weights) grad_weights = (v_nn * through_kernel).sum(-1);
    if (want_values) {
      grad_values = scatter_rows(through_kernel * weights.unsqueeze(-1), indices, values.size(1));
    }
  }
  if (want_kernel) {
    grad_kernel = depthwise ? at::einsum("gik,gikc,gic->ck", {weights, v_nn, dy})
                            : at::einsum("gio,gik,gikc->ock", {dy, weights, v_nn});
  }
  if (want_bias) grad_bias = dy.sum(std::vector<int64_t>{0, 1});
  return {grad_values, grad_weights, grad_kernel, grad_bias};
}

}  // namespace convnn::reference
