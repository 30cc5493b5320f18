#pragma once
// Plain-ATen reference implementations: the paper's Algorithm 1, written for clarity. They are the
// ground truth that every fused kernel is tested against, and the "reference path" of convnn bench.
// They assume inputs were validated by src/ops/checks.h.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <array>
#include <tuple>

#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"
#include "ops/reference/rho_forms.h"

namespace convnn::reference {

// Full [G,N,M] similarity matrix, with the mask applied (masked entries are -inf). For distance
// similarities this returns the ranking key (-distance), not exp(-distance).
at::Tensor ranking_keys(const at::Tensor& queries, const at::Tensor& keys, Similarity similarity,
                        const c10::optional<at::Tensor>& mask);

// Similarity of each query with its selected keys, as knn_select reports it (exp(-distance) for
// the distance similarities): [G,N,K], differentiable through ATen autograd. No mask is applied.
at::Tensor selected_scores(const at::Tensor& queries, const at::Tensor& keys,
                           const at::Tensor& indices, Similarity similarity);

std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, Similarity similarity,
                                              const c10::optional<at::Tensor>& mask,
                                              bool index_order);

std::tuple<at::Tensor, at::Tensor> knn_select_backward(const at::Tensor& grad_scores,
                                                       const at::Tensor& queries,
                                                       const at::Tensor& keys,
                                                       const at::Tensor& indices,
                                                       const at::Tensor& scores,
                                                       Similarity similarity);

// Algorithm 1: gather the neighbourhoods, scale by the weights, Conv1d with kernel K, stride K.
at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights,
                         const at::Tensor& indices, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>& bias);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask);

// rho_weights (rho applied to the selected scores): ops/reference/rho_forms.h, included above.

// knn_select, rho_weights and knn_aggregate composed: (output, scores, indices, weights).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    Similarity similarity, const c10::optional<at::Tensor>& mask, bool index_order, Rho rho,
    double temperature);

}  // namespace convnn::reference
