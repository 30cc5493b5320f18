#include "convnn/models/geometry.h"

#include <c10/util/Exception.h>
#include <torch/nn/modules/conv.h>

#include "convnn/nn/modules/convnn.h"

namespace convnn::models {

int64_t conv_output_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
  return (input + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
}

namespace {

int64_t explicit_padding(const torch::nn::detail::ConvNdOptions<2>& o, const std::string& layer) {
  const auto* padding = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  TORCH_CHECK(padding != nullptr && (*padding)->at(0) == (*padding)->at(1), layer,
              ": the model walk needs a Conv2d with equal explicit padding on both axes");
  return (*padding)->at(0);
}

}  // namespace

void advance_spatial_layer(const torch::nn::Module& module, const std::string& layer, int64_t& height,
                           int64_t& width) {
  if (const auto* conv = dynamic_cast<const torch::nn::Conv2dImpl*>(&module)) {
    const auto& o = conv->options;
    const int64_t pad = explicit_padding(o, layer);
    height = conv_output_size(height, o.kernel_size()->at(0), o.stride()->at(0), pad, o.dilation()->at(0));
    width = conv_output_size(width, o.kernel_size()->at(1), o.stride()->at(1), pad, o.dilation()->at(1));
    return;
  }
  const nn::ConvNN2dOptions* convnn = nullptr;
  if (const auto* m = dynamic_cast<const nn::ConvNN2dImpl*>(&module)) convnn = &m->options;
  if (const auto* m = dynamic_cast<const nn::BranchingConv2dImpl*>(&module)) convnn = &m->options.convnn();
  TORCH_CHECK(convnn != nullptr, layer, ": the model walk knows Conv2d, ConvNN2d and BranchingConv2d, got ",
              module.name());
  // ConvNN keeps the size, divided by its stride (queries on every stride-th position).
  height = (height + convnn->stride()->at(0) - 1) / convnn->stride()->at(0);
  width = (width + convnn->stride()->at(1) - 1) / convnn->stride()->at(1);
}

void check_spatial_layer(const torch::nn::Module& module, const std::string& layer, int64_t height,
                         int64_t width) {
  if (const auto* convnn = dynamic_cast<const nn::ConvNN2dImpl*>(&module)) {
    convnn->check_input_size({height, width}, layer);
  } else if (const auto* branching = dynamic_cast<const nn::BranchingConv2dImpl*>(&module)) {
    branching->check_input_size({height, width}, layer);
  }
}

}  // namespace convnn::models
