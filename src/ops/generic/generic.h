#pragma once
// The device-generic implementation of the core ops: plain ATen, so it runs on every device that
// PyTorch supports. It is registered under CompositeExplicitAutograd, which the dispatcher gives to
// every backend without a kernel of its own (the CPU keeps its fused kernels, Meta its shape
// kernels), and it is callable directly, so that tests prove it on CPU and meta tensors.
//
// Same contract as the CPU ops (docs/operator.md), and three properties of its own
// (docs/operator.md, "The device-generic path"):
// - bounded memory: the similarity scores exist one block of query rows at a time, never as the
//   whole [G,N,M] matrix; the block is sized so that its live tensors stay under block_bytes();
// - deterministic backward: gradients w.r.t. keys and values are summed through an inverse index in
//   a fixed order, never with atomics, so repeated backward passes are bitwise equal;
// - no host synchronisation beyond one read per forward (whether a score was NaN or +inf, which
//   must raise) and the value checks of src/ops/checks.h.
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "ops/op_signatures.h"

namespace convnn::ops::generic {

// The budget of one block's live tensors, in bytes. Default 256 MiB, or the environment variable
// CONVNN_GENERIC_BLOCK_BYTES (a positive integer), read once on first use.
int64_t block_bytes();
// Overrides the budget for the rest of the process (tests use a few KB to force many blocks).
void set_block_bytes(int64_t bytes);

// Whether CPU calls go to these kernels instead of the fused CPU ones: the environment variable
// CONVNN_CPU_KERNELS=generic (default "fused"), read when the library loads. The fused CPU files
// then register nothing and the dispatcher hands CPU tensors to CompositeExplicitAutograd, which is
// how the whole op test matrix runs through this path (scripts/test.sh).
bool serves_cpu();

// The bodies, on inputs their op's check has passed (src/ops/op_signatures.h): what the attention's
// backward calls per block of rows, where checking again would only repeat the work.
op::Body<op::KnnSelect> knn_select_checked;
op::Body<op::KnnSelectBackward> knn_select_backward_checked;
op::Body<op::KnnAggregate> knn_aggregate_checked;
op::Body<op::KnnAggregateBackward> knn_aggregate_backward_checked;
op::Body<op::KnnAttention> knn_attention_checked;
op::Body<op::KnnAttentionBackward> knn_attention_backward_checked;

// The kernels registered under CompositeExplicitAutograd: the op's check, then the body.
inline constexpr auto knn_select = op::checked_kernel<op::KnnSelect, &knn_select_checked>;
inline constexpr auto knn_select_backward = op::checked_kernel<op::KnnSelectBackward, &knn_select_backward_checked>;
inline constexpr auto knn_aggregate = op::checked_kernel<op::KnnAggregate, &knn_aggregate_checked>;
inline constexpr auto knn_aggregate_backward =
    op::checked_kernel<op::KnnAggregateBackward, &knn_aggregate_backward_checked>;
inline constexpr auto knn_attention = op::checked_kernel<op::KnnAttention, &knn_attention_checked>;
inline constexpr auto knn_attention_backward =
    op::checked_kernel<op::KnnAttentionBackward, &knn_attention_backward_checked>;

// d(scores) from d(weights) for softmax rho, w (g - sum w g) / T per row, in the accumulation type:
// masked slots have w = 0 and get 0.
at::Tensor softmax_rho_backward(const at::Tensor& weights, const at::Tensor& grad_weights,
                                double temperature);

}  // namespace convnn::ops::generic
