#pragma once
// The contract of the fused knn_attention kernel (select + rho + aggregate in one pass) on every
// device: the select and aggregate structs it composes, and rho.
#include "convnn/ops/rho.h"
#include "ops/kernels/knn_aggregate_params.h"
#include "ops/kernels/knn_select_params.h"

namespace convnn::kernels {

template <typename scalar_t, typename acc_t>
struct KnnAttentionParams {
  // The whole select problem; its scores and indices ([G,N,K] contiguous) are outputs.
  KnnSelectParams<scalar_t, acc_t> select;
  // The whole aggregation; its weights and indices views point at the outputs of this op.
  AggregateForwardParams<scalar_t> aggregate;
  Rho rho = Rho::Softmax;
  acc_t temperature = 1;
  scalar_t* weights = nullptr;  // [G,N,K] contiguous out
};

// knn_attention's backward, the three steps of its composition (the aggregation's backward, the
// softmax-rho backward, the select backward) run by one kernel.
template <typename scalar_t, typename acc_t>
struct KnnAttentionBackwardParams {
  // The whole aggregation backward; its grad_weights is left empty (the kernel keeps d(weights)).
  AggregateBackwardParams<scalar_t> aggregate;
  // The whole select backward, run when score_gradient; its grad_scores is left empty (the kernel
  // keeps d(scores)), and both of its outputs are written.
  KnnSelectBackwardParams<scalar_t, acc_t> select;
  const scalar_t* weights = nullptr;  // [G,N,K] contiguous: the forward's softmax weights
  acc_t temperature = 1;
  bool score_gradient = false;  // softmax rho, and d(queries) or d(keys) wanted
};

}  // namespace convnn::kernels
