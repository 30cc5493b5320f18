#pragma once
// The host side of knn_attention's Triton kernels (python/convnn/_triton/attention.py and
// attention_backward.py): the fused forward, the composed forward's rho and aggregation, and the
// backward's kernels, launched from C++ through a LaunchRunner as in aggregate_launches.h (tests
// record the launches on CPU tensors).
#include <ATen/core/Tensor.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "convnn/ops/rho.h"
#include "convnn/ops/similarity.h"
#include "ops/cuda/triton/aggregate_launches.h"

namespace convnn::ops::cuda::triton {

/// Whether the kernel takes these (checked) inputs: a depthwise kernel [C,K], K within the widest
/// running top-K, every size within 32 bits, the slices within CUDA's grid. (A standard kernel
/// [C',C,K] is not fused: knn_attention composes the core ops then.)
bool attention_fits(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                    const at::Tensor& kernel, int64_t k);
/// The key of every width and mask kind of the fused attention kernel for an op of `dtype`.
const std::vector<std::string>& attention_kernel_keys(at::ScalarType dtype);

/// (output, scores, indices, weights) as convnn::knn_attention, for inputs that the caller checked
/// and attention_fits accepts (float32, bfloat16 or float16; [G,N,D] or, heads as a dimension,
/// [B,H,N,D] of any strides but the features', read in place; mask undefined, bool or floating,
/// [N,M] or one per slice). The kernel reads queries, keys, values, kernel and bias in
/// top_k_input_dtype, works in float32 and rounds the scores and weights to the op's dtype where
/// the composed ops would; it writes a [B,H,N,D] call's output as [B,N,H,C].
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_forward(
    const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel,
    const at::Tensor& bias, int64_t k, Similarity similarity, const at::Tensor& mask, bool index_order, Rho rho,
    double temperature, const LaunchRunner& run);

/// Whether the composed forward's rho and aggregation kernel takes these (checked) inputs: a
/// depthwise kernel [C,K], K within the widest running top-K, every size within 32 bits, the slices
/// within CUDA's grid.
bool rho_aggregate_fits(const at::Tensor& scores, const at::Tensor& values, const at::Tensor& kernel);
/// The key of every width of that kernel for an op of `dtype`.
const std::vector<std::string>& rho_aggregate_kernel_keys(at::ScalarType dtype);

/// (output, weights) of knn_attention from the select's [G,N,K] scores and indices: rho and the
/// depthwise aggregation in one kernel (attention._rho_aggregate_kernel), for inputs that the caller
/// checked and rho_aggregate_fits accepts (float32, bfloat16 or float16; values [G,M,C]). The kernel
/// reads scores, values, kernel and bias in top_k_input_dtype and writes both outputs in the op's
/// dtype, as the composition of rho_weights and knn_aggregate would: NaN weights and output rows
/// where the select could not rank a row (NaN scores).
std::pair<at::Tensor, at::Tensor> rho_aggregate(const at::Tensor& scores, const at::Tensor& indices,
                                                const at::Tensor& values, const at::Tensor& kernel,
                                                const at::Tensor& bias, Rho rho, double temperature,
                                                const LaunchRunner& run);

/// Whether the backward's softmax scores gradient kernel takes these (checked) inputs: a depthwise
/// kernel, K within the widest running top-K, every size within 32 bits.
bool scores_gradient_fits(const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
                          const at::Tensor& kernel);
/// The key of every width of that kernel for `dtype` (float32, bfloat16 or float16).
const std::vector<std::string>& scores_gradient_kernel_keys(at::ScalarType dtype);

/// d(scores) of knn_attention with softmax rho and a depthwise kernel, from the incoming gradient of
/// its output (the aggregation's weights gradient and the softmax-rho backward in one kernel, as
/// attention.softmax_scores_gradient), in the op's dtype.
at::Tensor softmax_scores_gradient(const at::Tensor& grad_output, const at::Tensor& values, const at::Tensor& weights,
                                   const at::Tensor& indices, const at::Tensor& kernel, double temperature,
                                   const LaunchRunner& run);

/// Whether the two-kernel backward (attention_backward.py) takes these (checked) inputs: softmax
/// rho, a dot-product similarity (dot, scaled_dot), a depthwise kernel, K within the widest
/// running top-K, no empty dimension, every size within 32 bits. The other backwards compose.
bool attention_backward_fits(const at::Tensor& queries, const at::Tensor& keys, const at::Tensor& values,
                             const at::Tensor& kernel, const at::Tensor& scores, Similarity similarity, Rho rho);
/// The key of both kernels at every width for `dtype` (float32, bfloat16 or float16).
const std::vector<std::string>& attention_backward_kernel_keys(at::ScalarType dtype);

/// The key/value rows by the length of their run in the inverse index (run_start, G*M + 1
/// entries), longest first, ties in row order: the column kernel's blocks of consecutive rows in
/// this order step about as often as their rows' mean run, where blocks of neighbouring rows step
/// as often as their most-read row (twice the mean at the paper's configuration;
/// scripts/triton_cost_report.py). int32 positions; every run at most `longest` long.
at::Tensor busiest_first(const at::Tensor& run_start, int64_t longest);

/// [d queries, d keys, d values, d kernel, d bias] of knn_attention for inputs that the caller
/// checked and attention_backward_fits accepts: the row kernel, the inverse index, the rows busiest
/// first, the column kernel. grad_output, queries, keys and values ([G,N,*] or [B,H,N,*]) are read
/// in place with unit-stride rows; scores, indices and weights contiguous.
std::vector<at::Tensor> attention_backward(const at::Tensor& grad_output, const at::Tensor& queries,
                                           const at::Tensor& keys, const at::Tensor& values, const at::Tensor& kernel,
                                           const at::Tensor& scores, const at::Tensor& indices,
                                           const at::Tensor& weights, Similarity similarity, double temperature,
                                           const LaunchRunner& run);

}  // namespace convnn::ops::cuda::triton
