#pragma once
// The paper's Algorithm 1 (its PyTorch listing) in plain ATen, with ATen's autograd: the
// "reference" path of `convnn bench`, and a multi-head self-attention baseline with the same
// projections. Both take their weights from a ConvNNAttention, so all three compute on one set of
// parameters.
#include <ATen/core/Tensor.h>

#include "convnn/nn/modules/convnn.h"
#include "convnn/ops/similarity.h"

namespace convnn::bench {

/// Weights of one bias-free attention layer (the paper's ViT). Linear weights are [C,C] with
/// y = x W^T; the kernel is depthwise [d,K] or standard [d',d,K] (d = C / heads), shared by all
/// heads.
struct AttentionWeights {
  at::Tensor query, key, value, output;
  at::Tensor kernel;
};

/// The module's own tensors (not copies), so gradients of every path land on the same parameters.
/// The module must be bias-free with a shared (not per-head) kernel.
AttentionWeights attention_weights(const nn::ConvNNAttentionImpl& module);

/// Algorithm 1 on folded heads. queries/keys [G,N,d] / [G,M,d], values [G,M,C] -> [G,N,C'].
/// S = Q K^T (÷ sqrt(d) for scaled_dot), at::topk, softmax, gather of V through expand, product
/// with the weights, reshape to [G,C,N*K], at::conv1d with kernel K and stride K (groups = C for
/// the depthwise kernel [C,K], 1 for the standard kernel [C',C,K]). similarity: dot or scaled_dot.
at::Tensor reference_conv_nn(const at::Tensor& queries, const at::Tensor& keys,
                             const at::Tensor& values, const at::Tensor& kernel, int64_t k,
                             Similarity similarity);

/// The whole layer on [B,N,C]: projections, heads folded into the batch, reference_conv_nn, heads
/// unfolded, output projection.
at::Tensor reference_attention(const at::Tensor& input, const AttentionWeights& weights,
                               int64_t heads, int64_t k, Similarity similarity);

/// Multi-head self-attention on [B,N,C] with the same projections, through
/// at::scaled_dot_product_attention (scale 1/sqrt(d) for scaled_dot, 1 for dot).
at::Tensor mhsa_attention(const at::Tensor& input, const AttentionWeights& weights, int64_t heads,
                          Similarity similarity);

}  // namespace convnn::bench
