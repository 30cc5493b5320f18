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

#include <initializer_list>

#include "ops/op_signatures.h"

namespace convnn::autograd {

/// True when a torch.func transform is active or one of `inputs` carries a forward-mode tangent:
/// then the forward ops go through ATen's autograd (undefined tensors are skipped).
bool needs_aten_autograd(std::initializer_list<at::Tensor> inputs);

/// True when the backward ops must build a graph: grad mode is on and an input requires grad.
bool builds_a_graph(std::initializer_list<at::Tensor> inputs);

namespace op = ops::op;

// The forward ops through the reference composition, checked as every kernel is (their bodies take
// what the op's check established; src/ops/op_signatures.h). knn_attention_aten's scores, indices
// and weights come back detached: as from the fused op, only the output carries a gradient.
op::Body<op::KnnSelect> knn_select_aten_checked;
op::Body<op::KnnAggregate> knn_aggregate_aten_checked;
op::Body<op::KnnAttention> knn_attention_aten_checked;
inline constexpr auto knn_select_aten = op::checked_kernel<op::KnnSelect, &knn_select_aten_checked>;
inline constexpr auto knn_aggregate_aten = op::checked_kernel<op::KnnAggregate, &knn_aggregate_aten_checked>;
inline constexpr auto knn_attention_aten = op::checked_kernel<op::KnnAttention, &knn_attention_aten_checked>;

// The backward ops as differentiable functions of all their tensor inputs (the incoming gradient
// included), for create_graph=True. Same arguments and results as the ops.
op::Body<op::KnnSelectBackward> knn_select_backward_aten_checked;
op::Body<op::KnnAggregateBackward> knn_aggregate_backward_aten_checked;
op::Body<op::KnnAttentionBackward> knn_attention_backward_aten_checked;
inline constexpr auto knn_select_backward_aten =
    op::checked_kernel<op::KnnSelectBackward, &knn_select_backward_aten_checked>;
inline constexpr auto knn_aggregate_backward_aten =
    op::checked_kernel<op::KnnAggregateBackward, &knn_aggregate_backward_aten_checked>;
inline constexpr auto knn_attention_backward_aten =
    op::checked_kernel<op::KnnAttentionBackward, &knn_attention_backward_aten_checked>;

}  // namespace convnn::autograd
