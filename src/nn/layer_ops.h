#pragma once
// What the layer ops (src/nn/layer_ops.cpp) build, for C++ callers that compare against the
// Python layers (tests/python_parity).
#include <torch/nn/modules/container/any.h>

#include <string>
#include <vector>

#include "convnn/nn/options/convnn.h"

namespace convnn::nn::detail {

// The "name=value" texts of a layer's options, as the Python layers pass them back.
std::vector<std::string> option_texts(ConvNN2dOptions options);
std::vector<std::string> option_texts(BranchingConv2dOptions options);
std::vector<std::string> option_texts(ConvNNAttentionOptions options);

// The C++ layer (ConvNN1d, ConvNN2d, ConvNN3d, ConvNNAttention, BranchingConv2d, BranchingConv3d) built from "name=value"
// option texts, exactly as convnn::layer_parameters builds it.
torch::nn::AnyModule make_layer(const std::string& layer, const std::vector<std::string>& options);

}  // namespace convnn::nn::detail
