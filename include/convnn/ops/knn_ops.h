#pragma once
// The two core ConvNN operators, called through the PyTorch dispatcher (so CPU, CUDA and Autograd
// implementations are picked by the inputs). Schemas, as registered in TORCH_LIBRARY(convnn, ...):
//
//   convnn::knn_select(Tensor queries, Tensor keys, int k, str similarity, Tensor? mask,
//                      bool index_order) -> (Tensor scores, Tensor indices)
//   convnn::knn_aggregate(Tensor values, Tensor weights, Tensor indices, Tensor kernel,
//                         Tensor? bias) -> Tensor
//   convnn::knn_attention(Tensor queries, Tensor keys, Tensor values, Tensor kernel, Tensor? bias,
//                         int k, str similarity, Tensor? mask, bool index_order, str rho,
//                         float temperature) -> (Tensor output, Tensor scores, Tensor indices,
//                                                Tensor weights)
//
// Semantics: docs/operator.md.
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <array>
#include <string>
#include <tuple>

namespace convnn::ops {

// queries [G,N,D], keys [G,M,D] -> scores [G,N,k] (differentiable w.r.t. queries and keys) and
// indices [G,N,k] int64 in [0,M). Selection is by descending score with the lower candidate index
// winning ties; masked candidates (mask false, or additive -inf) carry the score -inf and are only
// chosen when a row has fewer than k valid candidates. mask: [N,M], [G,N,M], or [G',N,M] with G'
// dividing G, a mask slice serving G/G' consecutive slices (docs/operator.md, "Masks").
// index_order=true reorders each row's k slots by ascending candidate index.
std::tuple<at::Tensor, at::Tensor> knn_select(const at::Tensor& queries, const at::Tensor& keys,
                                              int64_t k, const std::string& similarity,
                                              const c10::optional<at::Tensor>& mask,
                                              bool index_order);

// values [G,M,C], weights [G,N,K], indices [G,N,K] int64, kernel [C,K] (depthwise) or
// [C',C,K] (standard), bias [C'] -> [G,N,C'] (C' = C for depthwise):
//   y[g,i,:] = sum_k weights[g,i,k] * kernel[..,k] applied to values[g, indices[g,i,k], :] + bias.
at::Tensor knn_aggregate(const at::Tensor& values, const at::Tensor& weights,
                         const at::Tensor& indices, const at::Tensor& kernel,
                         const c10::optional<at::Tensor>& bias);

// The fused path: knn_select, rho ("uniform", "mean" or "softmax", with temperature) and
// knn_aggregate in one op, on the same arguments. Returns (output [G,N,C'], scores, indices and
// weights [G,N,k]); it equals the composition of the three, and never materialises the [G,N,M]
// scores or the gathered neighbourhoods. Differentiable w.r.t. queries and keys (softmax rho
// only: the other rhos do not depend on the score values), values, kernel and bias.
// With heads as a dimension, queries [B,H,N,D], keys [B,H,M,D] and values [B,H,M,C] of any
// strides (a layer's head-split projection, read in place where a kernel can; mask [N,M] or
// [B,H,N,M]) give scores, indices and weights [B,H,N,K] and the output [B,H,N,C] stored as
// [B,N,H,C], and the backward gradients of the inputs' shapes stored likewise (docs/operator.md,
// "Heads as a dimension").
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
    const at::Tensor& kernel, const c10::optional<at::Tensor>& bias, int64_t k,
    const std::string& similarity, const c10::optional<at::Tensor>& mask, bool index_order,
    const std::string& rho, double temperature);

// Whether knn_attention on `queries`' device reads [B,H,N,D] heads in place (a device with a fused
// kernel of its own: CUDA's Triton kernels). Elsewhere the op folds them into [B*H,N,D] copies, so
// a caller with [B,N,H*D] rows does better to fold once itself: autograd then saves the folds, where
// the op's backward would fold its saved heads again (ConvNNAttention asks this).
bool knn_attention_reads_head_dims_in_place(const at::Tensor& queries);

// The backward ops the Autograd kernels call; exposed so fused kernels can be compared with them.
// Returns (grad_queries, grad_keys).
std::tuple<at::Tensor, at::Tensor> knn_select_backward(const at::Tensor& grad_scores,
                                                       const at::Tensor& queries,
                                                       const at::Tensor& keys,
                                                       const at::Tensor& indices,
                                                       const at::Tensor& scores,
                                                       const std::string& similarity);
// Returns (grad_values, grad_weights, grad_kernel, grad_bias). output_mask says which of the four
// to compute, in that order (as aten::convolution_backward's); the others come back undefined and
// cost nothing, e.g. d(weights) for uniform rho, whose weights need no gradient.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_aggregate_backward(
    const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
    const at::Tensor& indices, const at::Tensor& kernel, std::array<bool, 4> output_mask);

// Returns (grad_queries, grad_keys, grad_values, grad_kernel, grad_bias); output_mask says which
// to compute, in that order, and the others come back undefined. The query and key gradients are
// undefined for rhos without a score gradient (uniform, mean) even when asked for.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> knn_attention_backward(
    const at::Tensor& grad_output, const at::Tensor& queries, const at::Tensor& keys,
    const at::Tensor& values, const at::Tensor& kernel, const at::Tensor& scores,
    const at::Tensor& indices, const at::Tensor& weights, const std::string& similarity,
    const std::string& rho, double temperature, std::array<bool, 5> output_mask);

}  // namespace convnn::ops
