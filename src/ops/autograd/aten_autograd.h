#pragma once
// The core ops differentiated by ATen's own autograd, through the plain-ATen reference composition
// (src/ops/reference/). The Autograd kernels (src/ops/autograd/knn_*.cpp) use it where their fused
// first-order autograd::Function cannot serve, so training speed is unchanged everywhere else:
//  - under a torch.func transform (grad, vjp, jacrev, jacfwd, hessian, vmap over grad): functorch
//    cannot run a C++ torch::autograd::Function, and every ATen op of the composition has its
//    functorch rules;
//  - with a forward-mode tangent on an input (torch.autograd.forward_ad, jvp): autograd::Function
//    has no forward formula, ATen's ops all have one;
//  - in the backward ops when a graph is being built (create_graph=True: double backward, Hessians,
//    gradient penalties): the gradient is ATen autograd of the reference forward with the selection
//    held fixed, so it is differentiable again to any order, with no second-order maths of our own.
// The selected indices are piecewise constant in the inputs, so every derivative holds the
// selection fixed, as torch.topk's and torch.sort's do.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <array>
#include <initializer_list>
#include <tuple>

namespace convnn::autograd {

/// True when a torch.func transform is active or one of `inputs` carries a forward-mode tangent:
/// then the forward ops go through ATen's autograd (undefined tensors are skipped).
bool needs_aten_autograd(std::initializer_list<at::Tensor> inputs);

/// True when the backward ops must build a graph: grad mode is on and an input requires grad.
bool builds_a_graph(std::initializer_list<at::Tensor> inputs);

// The forward ops through the reference composition, checked as the fused ops check.
std::tuple<at::Tensor, at::Tensor> knn_select_aten(const at::Tensor& queries, const at::Tensor& keys,
                                                   int64_t k, c10::string_view similarity,
                                                   const c10::optional<at::Tensor>& mask,
                                                   bool index_order);
at::Tensor knn_aggregate_aten(const at::Tensor& values, const at::Tensor& weights,
                              const at::Tensor& indices, const at::Tensor& kernel,
                              const c10::optional<at::Tensor>& bias);
// scores, indices and weights come back detached: as from the fused op, only the output carries
// a gradient.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_aten(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    c10::string_view similarity, const c10::optional<at::Tensor>& mask, bool index_order,
    c10::string_view rho, double temperature);

// The backward ops as differentiable functions of all their tensor inputs (the incoming gradient
// included), for create_graph=True. Same arguments and results as the ops.
std::tuple<at::Tensor, at::Tensor> knn_select_backward_aten(
    const at::Tensor& grad_scores, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& indices, const at::Tensor& scores, c10::string_view similarity);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward_aten(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward_aten(
    const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, c10::string_view similarity,
    c10::string_view rho, double temperature, std::array<bool, 5> output_mask);

}  // namespace convnn::autograd
