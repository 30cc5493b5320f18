#pragma once
// The forward pass of each layer as a function of its options and its tensors: the one
// implementation that the C++ modules (src/nn/modules/convnn.cpp) and the layer ops that Python
// calls (src/nn/layer_ops.cpp) share, so a Python layer computes exactly what the C++ one does.
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <string>
#include <tuple>

#include "convnn/nn/neighbours.h"
#include "convnn/nn/options/convnn.h"
#include "nn/modules/attention_masks.h"

namespace convnn::nn::detail {

// A Linear map (undefined weight: the identity, i.e. no projection).
struct LinearTensors {
  at::Tensor weight, bias;
};

struct ConvNNTensors {
  at::Tensor kernel, bias;
  LinearTensors query, key, value;  // projection = linear only
};

struct AttentionTensors {
  at::Tensor kernel, bias;
  LinearTensors query, key, value, output;
  AttentionMasks masks;  // the options' fixed mask and the call's attn_mask and key_padding_mask
};

struct BranchingTensors {
  c10::optional<ConvNNTensors> convnn;  // absent when lambda = 0
  LinearTensors conv;                   // the convolution branch (absent when lambda = 1)
  LinearTensors mix;                    // the 1x1 mixing convolution
};

// The operator's options of a ConvNN1d / 2d / 3d layer.
template <size_t D>
functional::ConvNNFuncOptions func_options(const ConvNNOptions<D>& options);

// `generator` is the draw for random candidates (CandidateDraw::generator), or none. A non-null
// `neighbours` receives what the forward selected (the default forward keeps nothing).
template <size_t D>
at::Tensor convnn_forward(const ConvNNOptions<D>& options, const at::Tensor& input,
                          const ConvNNTensors& tensors, c10::optional<at::Generator> generator,
                          Neighbours* neighbours = nullptr);

// A layer's input must have its parameters' dtype, except under autocast; the message names the layer.
void check_input_dtype(const char* layer, const at::Tensor& input, const at::Tensor& parameter);

// ConvNNAttention's input: [B,N,C] or [N,C] with C = embed_dim, of the dtype of its kernel (`weight`).
void check_attention_input(const ConvNNAttentionOptions& options, const at::Tensor& input, const at::Tensor& weight);

// The operator's options of a ConvNNAttention layer, without the call's mask and generator.
functional::ConvNNFuncOptions attention_func_options(const ConvNNAttentionOptions& options);

// input through a Linear map (its weight and, where defined, its bias).
at::Tensor apply_linear(const LinearTensors& linear, const at::Tensor& input);

// ConvNNAttention's forward between its projections: the projected queries, keys and values
// ([B,N,C] or [N,C]) -> the aggregated values after dropout, before the output projection. The
// Python layer runs its projections around it: through project_qkv while they are plain nn.Linear
// modules, else as the modules (so that a replaced or wrapped projection, e.g. LoRA, takes effect).
at::Tensor attention_aggregate(const ConvNNAttentionOptions& options, const at::Tensor& queries,
                               const at::Tensor& keys, const at::Tensor& values, const AttentionTensors& tensors,
                               c10::optional<at::Generator> generator, bool training,
                               Neighbours* neighbours = nullptr);

// ConvNNAttention's query, key and value projections of `input`: one matrix product of the three
// weights concatenated ([3C, C], as timm's qkv) where they share a dtype and device and all or none
// have a bias, else three. The Python layer's rule is the same (python/convnn/nn/modules.py), so
// the two layers stay bitwise equal.
std::tuple<at::Tensor, at::Tensor, at::Tensor> project_qkv(const AttentionTensors& tensors, const at::Tensor& input);

at::Tensor attention_forward(const ConvNNAttentionOptions& options, const at::Tensor& input,
                             const AttentionTensors& tensors, c10::optional<at::Generator> generator,
                             bool training, Neighbours* neighbours = nullptr);

// "BranchingConv2d" or "BranchingConv3d".
std::string branching_layer_name(int64_t spatial_dims);
// The ConvNN branch's options: the layer's, with its share of the channels.
template <size_t D>
ConvNNOptions<D> convnn_branch_options(const BranchingConvOptions<D>& options);
// Output channels of the ConvNN branch: round(lambda * out_channels).
template <size_t D>
int64_t convnn_branch_channels(const BranchingConvOptions<D>& options);

template <size_t D>
at::Tensor branching_forward(const BranchingConvOptions<D>& options, const at::Tensor& input,
                             const BranchingTensors& tensors, c10::optional<at::Generator> generator,
                             Neighbours* neighbours = nullptr);

}  // namespace convnn::nn::detail
