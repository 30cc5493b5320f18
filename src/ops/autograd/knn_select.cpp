// knn_select and knn_select_backward under the Autograd key. The forward redispatches
// below autograd, the backward calls knn_select_backward, so a device that adds a fused
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

class KnnSelectFunction : public torch::autograd::Function<KnnSelectFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& queries,
                               const at::Tensor& keys, int64_t k, const std::string& similarity,
                               const c10::optional<at::Tensor>& mask, bool index_order) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [scores, indices] = ops::knn_select(queries, keys, k, similarity, mask, index_order);
    ctx->save_for_backward({queries, keys, indices, scores});
    ctx->saved_data["similarity"] = similarity;
    ctx->mark_non_differentiable({indices});
    return {scores, indices};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_queries, grad_keys] = ops::knn_select_backward(
        grads[0].defined() ? grads[0] : at::zeros_like(saved[3]), saved[0], saved[1], saved[2],
        saved[3], ctx->saved_data["similarity"].toStringRef());
    return {grad_queries, grad_keys, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, c10::string_view similarity,
                                              const c10::optional<at::Tensor>& mask,
                                              bool index_order) {
  if (needs_aten_autograd({queries, keys})) {
    return knn_select_aten(queries, keys, k, similarity, mask, index_order);
  }
  auto out = KnnSelectFunction::apply(queries, keys, k, std::string(similarity), mask, index_order);
  return {out[0], out[1]};
}

// The backward op: the fused first-order backward, or, when a graph is being built
// (create_graph=True), the gradient through ATen's autograd, differentiable again.
std::tuple<at::Tensor, at::Tensor> knn_select_backward(
    const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& indices, const at::Tensor& scores, c10::string_view similarity) {
  if (builds_a_graph({grad_scores, queries, keys, scores})) {
    return knn_select_backward_aten(grad_scores, queries, keys, indices, scores, similarity);
  }
  at::AutoDispatchBelowADInplaceOrView guard;
  return ops::knn_select_backward(grad_scores, queries, keys, indices, scores, std::string(similarity));
}

}  // namespace

TORCH_LIBRARY_IMPL(convnn, Autograd, m) {
  op::implement<op::KnnSelect>(m, &knn_select);
  op::implement<op::KnnSelectBackward>(m, &knn_select_backward);
}

}  // namespace convnn::autograd
