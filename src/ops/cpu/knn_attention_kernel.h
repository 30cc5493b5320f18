#pragma once
// Fused ConvNN attention on the CPU: select + rho + aggregate in one pass over the queries.
// Per task (a slice, or a block of its query rows when there are few slices) the select kernel
// writes the block's K scores and indices, rho turns them into weights, and the aggregation kernel
// consumes both while they are still in cache; the [G,N,M] score matrix and the gathered neighbourhoods never
// exist. Scores, indices and weights ([G,N,K]) are outputs because the backward needs them.
// Free of torch types, like the kernels it composes.
#include <cstdint>

#include "ops/cpu/knn_aggregate_kernel.h"
#include "ops/cpu/knn_select_kernel.h"
#include "ops/kernels/knn_attention_params.h"

namespace convnn::cpu {

using kernels::KnnAttentionBackwardParams;
using kernels::KnnAttentionParams;

// Returns false (outputs unspecified) when a NaN or +inf score was met; the caller reports it.
// Deterministic and independent of the thread count, as the composed kernels are.
template <typename scalar_t, typename acc_t>
bool knn_attention_forward(const KnnAttentionParams<scalar_t, acc_t>& params);

// Whether knn_attention_backward (below) takes a problem of `slices` slices: it splits the work
// into tasks of whole slices, and needs enough of them to keep the threads busy (the decision is
// the shape's alone, so results never depend on the thread count); fewer run the composed steps.
bool attention_backward_splits_by_slices(int64_t slices);

// The backward's three steps (the aggregation's, softmax rho's, the selection's) per task of whole
// slices, each task's steps in turn while its slices' rows are in cache: the composed steps each
// pass over the whole problem, from memory. Float and double only (each task's d(kernel) and
// d(bias) are partial sums in the input type, added up as partial_sums.h says). Deterministic and
// independent of the thread count; the sums of d(kernel) and d(bias) run in another order than the
// composed steps', so they may differ from theirs in the last bits.
template <typename scalar_t, typename acc_t>
void knn_attention_backward(const KnnAttentionBackwardParams<scalar_t, acc_t>& params);

// grad_scores[r,:] = softmax-rho backward of rows r < rows ([rows, k] contiguous each).
template <typename scalar_t, typename acc_t>
void softmax_rho_backward(const scalar_t* weights, const scalar_t* grad_weights, int64_t rows,
                          int64_t k, acc_t temperature, scalar_t* grad_scores);

}  // namespace convnn::cpu
