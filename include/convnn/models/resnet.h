#pragma once
// ResNet-18/34/50 in the torchvision v1.5 layout (the stride of a bottleneck sits on its 3x3
// convolution), whose stride-1 3x3 convolutions can be ConvNN or branching layers as in the
// paper's CNN experiments. Module names follow torchvision (conv1, bn1, layer1.0.conv2, fc, ...).
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/pimpl.h>

#include <string_view>
#include <vector>

#include "convnn/models/batch_norm.h"
#include "convnn/models/cost.h"
#include "convnn/nn/options/convnn.h"

namespace convnn::models {

/// What replaces the stride-1 3x3 convolutions: nothing (conv), nn::ConvNN2d, or
/// nn::BranchingConv2d.
enum class ResNetLayer { Conv, ConvNN, Branching };
ResNetLayer parse_resnet_layer(std::string_view name);
const char* to_string(ResNetLayer layer);
/// The layers' names in enum order (the one table parse_resnet_layer and to_string read).
const std::vector<std::string>& resnet_layer_names();

/// The layer that fills a 3x3 slot, and its options.
struct ResNetLayerOptions {
  TORCH_ARG(ResNetLayer, layer) = ResNetLayer::Conv;
  /// Options of every ConvNN layer and ConvNN branch; channel counts are set per slot. The
  /// default is the paper's: identity Q/K/V, cosine, uniform rho, standard Conv1d without bias,
  /// K = 9, padding 1, all candidates.
  TORCH_ARG(nn::ConvNN2dOptions, convnn) = nn::ConvNN2dOptions(1, 1, 9).padding(1);
  /// Share of the branching layer's output channels that the ConvNN branch produces.
  TORCH_ARG(double, lambda) = 0.5;
  /// The stride-2 3x3 convolutions take the layer too, as a ConvNN layer of stride 2 (the paper
  /// replaces only the stride-1 ones). The parameters stay the convolutions' count.
  TORCH_ARG(bool, strided_slots) = false;
};

struct ResidualBlockOptions {
  ResidualBlockOptions(int64_t in_channels, int64_t planes, int64_t stride, bool bottleneck)
      : in_channels_(in_channels), planes_(planes), stride_(stride), bottleneck_(bottleneck) {}

  TORCH_ARG(int64_t, in_channels);
  /// Width of the block; it outputs planes (basic) or 4 * planes (bottleneck) channels.
  TORCH_ARG(int64_t, planes);
  TORCH_ARG(int64_t, stride);
  TORCH_ARG(bool, bottleneck);
  TORCH_ARG(ResNetLayerOptions, slots) = {};

 public:
  int64_t out_channels() const { return bottleneck_ ? 4 * planes_ : planes_; }
};

/// torchvision's BasicBlock (two 3x3) or Bottleneck (1x1, 3x3, 1x1), with BatchNorm after each
/// convolution and a 1x1 projection shortcut when the shape changes.
class ResidualBlockImpl : public torch::nn::Cloneable<ResidualBlockImpl> {
 public:
  explicit ResidualBlockImpl(ResidualBlockOptions options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);
  /// Adds this block's operations for an input of height x width and updates them to its output.
  void add_cost(CostReport& report, const std::string& stage, const std::string& name, int64_t& height,
                int64_t& width) const;
  /// check_spatial_layer (convnn/models/geometry.h) of every convolution for an input of height x
  /// width, which it updates to the block's output size.
  void check_input_size(const std::string& name, int64_t& height, int64_t& width) const;

  ResidualBlockOptions options;
  /// conv1, conv2 (, conv3): Conv2d, or ConvNN2d / BranchingConv2d in stride-1 3x3 slots.
  std::vector<torch::nn::AnyModule> convs;
  std::vector<BatchNorm2d> norms;
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(ResidualBlock);

struct ResNetOptions {
  /// depth: 18, 34 or 50.
  /* implicit */ ResNetOptions(int64_t depth) : depth_(depth) {}

  TORCH_ARG(int64_t, depth);
  TORCH_ARG(int64_t, num_classes) = 1000;
  TORCH_ARG(int64_t, in_channels) = 3;
  /// Width of the first stage (64 in torchvision); each later stage doubles it.
  TORCH_ARG(int64_t, width) = 64;
  /// For 28-32 px inputs: a 3x3 stride-1 stem convolution and no max-pool.
  TORCH_ARG(bool, small_stem) = false;
  TORCH_ARG(ResNetLayerOptions, slots) = {};

 public:
  /// Blocks per stage: {2,2,2,2} (18) or {3,4,6,3} (34, 50).
  std::vector<int64_t> blocks() const;
  bool bottleneck() const { return depth_ >= 50; }
};

class ResNetImpl : public torch::nn::Cloneable<ResNetImpl> {
 public:
  explicit ResNetImpl(ResNetOptions options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// [B, in_channels, H, W] -> logits [B, num_classes].
  at::Tensor forward(const at::Tensor& input);
  /// Every operation for one height x width image, and the parameters per stage (stem,
  /// layer1..layer4, head).
  CostReport cost(int64_t height, int64_t width) const;
  /// Raises, naming the layer, if a ConvNN layer would see fewer than k candidates on a height x
  /// width image; the model registry calls it when it builds a model for an image size.
  void check_image_size(int64_t height, int64_t width) const;
  /// The layers in the stride-1 3x3 slots, in order: what `layer` replaces (13 in ResNet-18 and
  /// ResNet-50, 29 in ResNet-34).
  std::vector<std::shared_ptr<torch::nn::Module>> slot_layers() const;

  ResNetOptions options;
  torch::nn::Conv2d conv1{nullptr};
  BatchNorm2d bn1{nullptr};
  torch::nn::MaxPool2d maxpool{nullptr};      // none with the small stem
  std::vector<torch::nn::Sequential> stages;  // layer1 .. layer4
  torch::nn::Linear fc{nullptr};

 private:
  /// The max pool's output size (unchanged without one).
  void advance_maxpool(int64_t& height, int64_t& width) const;
};
TORCH_MODULE(ResNet);

}  // namespace convnn::models
