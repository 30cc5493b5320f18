// knn_attention and knn_attention_backward under the Autograd key. The forward redispatches
// below autograd, the backward calls knn_attention_backward, so a device that adds a fused
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

// Gradients flow through the output only; scores, indices and weights are returned for inspection
// and for the backward, like flash attention's log-sum-exp.
class KnnAttentionFunction : public torch::autograd::Function<KnnAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& queries,
                               const at::Tensor& keys, const at::Tensor& values,
                               const at::Tensor& kernel, const c10::optional<at::Tensor>& bias,
                               int64_t k, const std::string& similarity,
                               const c10::optional<at::Tensor>& mask, bool index_order,
                               const std::string& rho, double temperature) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [output, scores, indices, weights] = ops::knn_attention(
        queries, keys, values, kernel, bias, k, similarity, mask, index_order, rho, temperature);
    ctx->save_for_backward({queries, keys, values, kernel, scores, indices, weights});
    ctx->saved_data["similarity"] = similarity;
    ctx->saved_data["rho"] = rho;
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({scores, indices, weights});
    return {output, scores, indices, weights};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    auto [grad_queries, grad_keys, grad_values, grad_kernel, grad_bias] = ops::knn_attention_backward(
        grads[0], s[0], s[1], s[2], s[3], s[4], s[5], s[6], ctx->saved_data["similarity"].toStringRef(),
        ctx->saved_data["rho"].toStringRef(), ctx->saved_data["temperature"].toDouble(),
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2),
         ctx->needs_input_grad(3), ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(4)});
    return {grad_queries, grad_keys, grad_values, grad_kernel, grad_bias, at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    c10::string_view similarity, const c10::optional<at::Tensor>& mask, bool index_order,
    c10::string_view rho, double temperature) {
  if (needs_aten_autograd({queries, keys, values, kernel, bias.value_or(at::Tensor())})) {
    return knn_attention_aten(queries, keys, values, kernel, bias, k, similarity, mask, index_order,
                              rho, temperature);
  }
  auto out = KnnAttentionFunction::apply(queries, keys, values, kernel, bias, k,
                                         std::string(similarity), mask, index_order,
                                         std::string(rho), temperature);
  return {out[0], out[1], out[2], out[3]};
}

// The backward op: the fused first-order backward, or, when a graph is being built
// (create_graph=True), the gradient through ATen's autograd, differentiable again.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward(
    const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, c10::string_view similarity,
    c10::string_view rho, double temperature, std::array<bool, 5> output_mask) {
  if (builds_a_graph({grad_output, queries, keys, values, kernel, scores, weights})) {
    return knn_attention_backward_aten(grad_output, queries, keys, values, kernel, scores, indices,
                                       weights, similarity, rho, temperature, output_mask);
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return ops::knn_attention_backward(grad_output, queries, keys, values, kernel, scores, indices,
                                     weights, std::string(similarity), std::string(rho), temperature,
                                     output_mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, Autograd, m) {
  op::implement<op::KnnAttention>(m, &knn_attention);
  op::implement<op::KnnAttentionBackward>(m, &knn_attention_backward);
}

}  // namespace convnn::autograd
