#pragma once
// How the spatial layers of the CNN models change a map's size, and whether a layer fits a size:
// one rule each, read by the cost counter (convnn/models/cost.h) and by the check a model runs
// when it is built (ResNetImpl::check_image_size).
#include <torch/nn/module.h>

#include <cstdint>
#include <string>

namespace convnn::models {

/// Output size of a Conv2d (or a pooling window with the same geometry) along one axis.
int64_t conv_output_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding,
                         int64_t dilation = 1);

/// Any 2-D layer of a ResNet slot: torch::nn::Conv2d (with equal explicit padding on both axes),
/// nn::ConvNN2d or nn::BranchingConv2d (both keep the size). Updates height and width to the
/// layer's output size. `layer` names it in errors.
void advance_spatial_layer(const torch::nn::Module& module, const std::string& layer, int64_t& height,
                           int64_t& width);

/// Whether the layer can run on a height x width input: a ConvNN layer (or a branching layer's
/// ConvNN branch) needs at least k candidates per query; a Conv2d always fits here. Raises naming
/// the layer, the map and the rule.
void check_spatial_layer(const torch::nn::Module& module, const std::string& layer, int64_t height,
                         int64_t width);

}  // namespace convnn::models
