// knn_aggregate and knn_aggregate_backward under the Autograd key. The forward redispatches
// below autograd, the backward calls knn_aggregate_backward, so a device that adds a fused
// backward needs no change here. Under torch.func, forward-mode AD and create_graph=True the op
// goes through ATen's autograd instead (aten_autograd.h, shared by the three ops).
#include <torch/autograd.h>
#include <torch/library.h>

#include "convnn/ops/knn_ops.h"
#include "ops/autograd/aten_autograd.h"

namespace convnn::autograd {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class KnnAggregateFunction : public torch::autograd::Function<KnnAggregateFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& values,
                               const at::Tensor& weights, const at::Tensor& indices,
                               const at::Tensor& kernel, const c10::optional<at::Tensor>& bias) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto output = ops::knn_aggregate(values, weights, indices, kernel, bias);
    ctx->save_for_backward({values, weights, indices, kernel});
    // An absent bias is no input of the node, so needs_input_grad(4) may be asked only with one.
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    return {output};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_values, grad_weights, grad_kernel, grad_bias] = ops::knn_aggregate_backward(
        grads[0], saved[0], saved[1], saved[2], saved[3],
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(3),
         ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(4)});
    return {grad_values, grad_weights, at::Tensor(), grad_kernel, grad_bias};
  }
};

at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights,
                         const at::Tensor& indices, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>& bias) {
  if (needs_aten_autograd({values, weights, kernel, bias.value_or(at::Tensor())})) {
    return knn_aggregate_aten(values, weights, indices, kernel, bias);
  }
  return KnnAggregateFunction::apply(values, weights, indices, kernel, bias)[0];
}

// The backward op: the fused first-order backward, or, when a graph is being built
// (create_graph=True), the gradient through ATen's autograd, differentiable again.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask) {
  if (builds_a_graph({grad_output, values, weights, kernel})) {
    return knn_aggregate_backward_aten(grad_output, values, weights, indices, kernel, output_mask);
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return ops::knn_aggregate_backward(grad_output, values, weights, indices, kernel, output_mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, Autograd, m) {
  op::implement<op::KnnAggregate>(m, &knn_aggregate);
  op::implement<op::KnnAggregateBackward>(m, &knn_aggregate_backward);
}

}  // namespace convnn::autograd
