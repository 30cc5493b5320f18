#include "convnn/models/resnet.h"

#include <c10/util/Exception.h>
#include <torch/nn/init.h>

#include <string>
#include <utility>

#include "convnn/nn/modules/convnn.h"
#include "util/enum_names.h"

namespace convnn::models {
namespace {

constexpr convnn::detail::NameTable<ResNetLayer, 3> kLayers{
    {{"conv", ResNetLayer::Conv}, {"convnn", ResNetLayer::ConvNN}, {"branching", ResNetLayer::Branching}}};

// Whether a 3x3 convolution of this stride is a slot: stride 1, or any with strided_slots.
bool slot_stride(int64_t stride, const ResNetLayerOptions& slots) { return stride == 1 || slots.strided_slots(); }

// The module for one convolution of a block: a 3x3 slot takes the configured layer (with the
// convolution's stride), everything else stays a bias-free Conv2d (torchvision).
torch::nn::AnyModule make_conv(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                               const ResNetLayerOptions& slots) {
  if (kernel == 3 && slot_stride(stride, slots) && slots.layer() != ResNetLayer::Conv) {
    auto convnn = slots.convnn();
    convnn.stride(stride);
    if (slots.layer() == ResNetLayer::ConvNN) {
      return torch::nn::AnyModule(nn::ConvNN2d(convnn.in_channels(in).out_channels(out)));
    }
    return torch::nn::AnyModule(
        nn::BranchingConv2d(nn::BranchingConv2dOptions(in, out).lambda(slots.lambda()).convnn(convnn)));
  }
  return torch::nn::AnyModule(torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false)));
}

// A 3x3 slot holds either a replacement layer or a Conv2d of that shape.
bool is_slot(const torch::nn::Module& module, const ResNetLayerOptions& slots) {
  const auto* conv = dynamic_cast<const torch::nn::Conv2dImpl*>(&module);
  return conv == nullptr ||
         (conv->options.kernel_size()->at(0) == 3 && slot_stride(conv->options.stride()->at(0), slots));
}

}  // namespace

ResNetLayer parse_resnet_layer(std::string_view name) { return convnn::detail::parse_name(kLayers, name, "layer"); }
const char* to_string(ResNetLayer layer) { return convnn::detail::name_of(kLayers, layer); }
const std::vector<std::string>& resnet_layer_names() { return convnn::detail::table_names<kLayers>(); }

// ----------------------------------------------------------------------------- ResidualBlock

ResidualBlockImpl::ResidualBlockImpl(ResidualBlockOptions options_) : options(std::move(options_)) {
  reset();
}

void ResidualBlockImpl::reset() {
  const auto& o = options;
  TORCH_CHECK(o.in_channels() >= 1 && o.planes() >= 1 && o.stride() >= 1,
              "ResidualBlock: in_channels, planes and stride must be at least 1, got ", o.in_channels(), ", ",
              o.planes(), " and ", o.stride());
  convs.clear();
  norms.clear();
  struct Conv {
    int64_t in, out, kernel, stride;
  };
  const std::vector<Conv> layout =
      o.bottleneck()
          ? std::vector<Conv>{{o.in_channels(), o.planes(), 1, 1},
                              {o.planes(), o.planes(), 3, o.stride()},
                              {o.planes(), o.out_channels(), 1, 1}}
          : std::vector<Conv>{{o.in_channels(), o.planes(), 3, o.stride()}, {o.planes(), o.planes(), 3, 1}};
  for (size_t i = 0; i < layout.size(); ++i) {
    const auto& c = layout[i];
    convs.push_back(make_conv(c.in, c.out, c.kernel, c.stride, o.slots()));
    register_module("conv" + std::to_string(i + 1), convs.back().ptr());
    norms.push_back(register_module("bn" + std::to_string(i + 1), BatchNorm2d(c.out)));
  }
  if (o.stride() != 1 || o.in_channels() != o.out_channels()) {
    downsample = register_module(
        "downsample",
        torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(o.in_channels(), o.out_channels(), 1)
                                                    .stride(o.stride())
                                                    .bias(false)),
                              BatchNorm2d(o.out_channels())));
  }
}

at::Tensor ResidualBlockImpl::forward(const at::Tensor& input) {
  at::Tensor out = input;
  for (size_t i = 0; i < convs.size(); ++i) {
    out = norms[i](convs[i].forward(out));
    if (i + 1 < convs.size()) out.relu_();
  }
  return (out + (downsample ? downsample->forward(input) : input)).relu_();
}

void ResidualBlockImpl::add_cost(CostReport& report, const std::string& stage, const std::string& name,
                                 int64_t& height, int64_t& width) const {
  const int64_t in_height = height, in_width = width;
  for (size_t i = 0; i < convs.size(); ++i) {
    const auto index = std::to_string(i + 1);
    add_spatial_layer(report, stage, name + ".conv" + index, *convs[i].ptr(), height, width);
    const int64_t elements = height * width * norms[i]->options.num_features();
    report.add(stage, name + ".bn" + index, "batchnorm", batch_norm_cost(elements));
    if (i + 1 < convs.size()) report.add(stage, name + ".relu", "relu", relu_cost(elements));
  }
  if (downsample) {
    int64_t h = in_height, w = in_width;
    add_spatial_layer(report, stage, name + ".downsample.0", *downsample->ptr(0), h, w);
    report.add(stage, name + ".downsample.1", "batchnorm", batch_norm_cost(h * w * options.out_channels()));
  }
  const int64_t elements = height * width * options.out_channels();
  report.add(stage, name, "add", addition_cost(elements));
  report.add(stage, name + ".relu", "relu", relu_cost(elements));
}

void ResidualBlockImpl::check_input_size(const std::string& name, int64_t& height, int64_t& width) const {
  for (size_t i = 0; i < convs.size(); ++i) {
    const auto layer = name + ".conv" + std::to_string(i + 1);
    check_spatial_layer(*convs[i].ptr(), layer, height, width);
    advance_spatial_layer(*convs[i].ptr(), layer, height, width);
  }
}

void ResidualBlockImpl::pretty_print(std::ostream& stream) const {
  stream << "convnn::models::ResidualBlock(" << options.in_channels() << ", " << options.out_channels()
         << ", stride=" << options.stride() << ", bottleneck=" << (options.bottleneck() ? "true" : "false")
         << ")";
}

// ----------------------------------------------------------------------------- ResNet

std::vector<int64_t> ResNetOptions::blocks() const {
  switch (depth_) {
    case 18:
      return {2, 2, 2, 2};
    case 34:
    case 50:
      return {3, 4, 6, 3};
    default:
      TORCH_CHECK(false, "ResNet: depth must be 18, 34 or 50, got ", depth_);
  }
}

ResNetImpl::ResNetImpl(ResNetOptions options_) : options(std::move(options_)) { reset(); }

void ResNetImpl::reset() {
  const auto& o = options;
  const auto blocks = o.blocks();
  TORCH_CHECK(o.num_classes() >= 1, "ResNet: num_classes must be at least 1, got ", o.num_classes());
  TORCH_CHECK(o.in_channels() >= 1, "ResNet: in_channels must be at least 1, got ", o.in_channels());
  TORCH_CHECK(o.width() >= 1, "ResNet: width must be at least 1, got ", o.width());
  TORCH_CHECK(
      o.slots().layer() != ResNetLayer::Branching || (o.slots().lambda() >= 0.0 && o.slots().lambda() <= 1.0),
      "ResNet: lambda must be in [0, 1], got ", o.slots().lambda());
  TORCH_CHECK(o.slots().layer() != ResNetLayer::Branching ||
                  o.slots().convnn().aggregation() == nn::Aggregation::Standard ||
                  o.slots().lambda() == 0.0 || o.slots().lambda() == 1.0,
              "ResNet: aggregation = depthwise keeps the channel count, so the branching layer's "
              "ConvNN branch (round(lambda * C) of C channels) needs lambda = 0 or 1, got lambda = ",
              o.slots().lambda());

  stages.clear();
  maxpool = nullptr;
  // The small stem keeps 28-32 px inputs large enough for four stages.
  const int64_t stem_kernel = o.small_stem() ? 3 : 7;
  conv1 = register_module("conv1",
                          torch::nn::Conv2d(torch::nn::Conv2dOptions(o.in_channels(), o.width(), stem_kernel)
                                                .stride(o.small_stem() ? 1 : 2)
                                                .padding(stem_kernel / 2)
                                                .bias(false)));
  bn1 = register_module("bn1", BatchNorm2d(o.width()));
  if (!o.small_stem()) {
    maxpool =
        register_module("maxpool", torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(3).stride(2).padding(1)));
  }
  int64_t channels = o.width();
  for (size_t s = 0; s < blocks.size(); ++s) {
    torch::nn::Sequential stage;
    for (int64_t b = 0; b < blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      ResidualBlock block(
          ResidualBlockOptions(channels, o.width() << s, stride, o.bottleneck()).slots(o.slots()));
      channels = block->options.out_channels();
      stage->push_back(block);
    }
    stages.push_back(register_module("layer" + std::to_string(s + 1), stage));
  }
  fc = register_module("fc", torch::nn::Linear(channels, o.num_classes()));

  // torchvision's initialisation: Kaiming-normal (fan_out, ReLU) for every Conv2d weight,
  // including the branching layer's, BatchNorm to identity. ConvNN kernels keep their own Conv1d
  // initialisation, as they are no Conv2d in the authors' code either.
  torch::NoGradGuard no_grad;
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* conv = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = module->as<torch::nn::BatchNorm2d>()) {
      bn->weight.fill_(1.0);
      bn->bias.zero_();
    }
  }
}

at::Tensor ResNetImpl::forward(const at::Tensor& input) {
  TORCH_CHECK(input.defined() && input.dim() == 4 && input.size(1) == options.in_channels(),
              "ResNet: input must be [B, ", options.in_channels(), ", H, W], got ",
              input.defined() ? input.sizes() : c10::IntArrayRef{});
  auto x = bn1(conv1(input)).relu_();
  if (maxpool) x = maxpool(x);
  for (auto& stage : stages) x = stage->forward(x);
  return fc(x.mean({2, 3}));
}

CostReport ResNetImpl::cost(int64_t height, int64_t width) const {
  TORCH_CHECK(height >= 1 && width >= 1, "ResNet: image size must be positive, got ", height, "x", width);
  CostReport report;
  add_spatial_layer(report, "stem", "conv1", *conv1, height, width);
  int64_t channels = options.width();
  report.add("stem", "bn1", "batchnorm", batch_norm_cost(height * width * channels));
  report.add("stem", "relu", "relu", relu_cost(height * width * channels));
  if (maxpool) {
    advance_maxpool(height, width);
    const int64_t window = maxpool->options.kernel_size()->at(0);
    report.add("stem", "maxpool", "maxpool", max_pool_cost(height * width * channels, window * window));
  }
  for (size_t s = 0; s < stages.size(); ++s) {
    const auto stage = "layer" + std::to_string(s + 1);
    for (size_t b = 0; b < stages[s]->size(); ++b) {
      const auto& block = stages[s]->at<ResidualBlockImpl>(b);
      block.add_cost(report, stage, stage + "." + std::to_string(b), height, width);
      channels = block.options.out_channels();
    }
  }
  report.add("head", "avgpool", "mean", mean_cost(height * width * channels, channels));
  report.add("head", "fc", "linear", linear_cost(1, channels, options.num_classes(), true));
  report.count_parameters(*this, [](const std::string& name) -> std::string {
    if (name.rfind("layer", 0) == 0) return name.substr(0, name.find('.'));
    return name.rfind("fc.", 0) == 0 ? "head" : "stem";
  });
  return report;
}

void ResNetImpl::advance_maxpool(int64_t& height, int64_t& width) const {
  if (!maxpool) return;
  const auto& p = maxpool->options;
  height = conv_output_size(height, p.kernel_size()->at(0), p.stride()->at(0), p.padding()->at(0));
  width = conv_output_size(width, p.kernel_size()->at(1), p.stride()->at(1), p.padding()->at(1));
}

void ResNetImpl::check_image_size(int64_t height, int64_t width) const {
  TORCH_CHECK(height >= 1 && width >= 1, "ResNet: image size must be positive, got ", height, "x", width);
  advance_spatial_layer(*conv1, "conv1", height, width);
  advance_maxpool(height, width);
  for (size_t s = 0; s < stages.size(); ++s) {
    const auto stage = "layer" + std::to_string(s + 1);
    for (size_t b = 0; b < stages[s]->size(); ++b) {
      stages[s]->at<ResidualBlockImpl>(b).check_input_size(stage + "." + std::to_string(b), height, width);
    }
  }
}

std::vector<std::shared_ptr<torch::nn::Module>> ResNetImpl::slot_layers() const {
  std::vector<std::shared_ptr<torch::nn::Module>> slots;
  for (const auto& stage : stages) {
    for (size_t b = 0; b < stage->size(); ++b) {
      for (const auto& conv : stage->at<ResidualBlockImpl>(b).convs) {
        if (is_slot(*conv.ptr(), options.slots())) slots.push_back(conv.ptr());
      }
    }
  }
  return slots;
}

void ResNetImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << "convnn::models::ResNet(depth=" << o.depth() << ", num_classes=" << o.num_classes()
         << ", in_channels=" << o.in_channels() << ", width=" << o.width()
         << ", small_stem=" << (o.small_stem() ? "true" : "false")
         << ", layer=" << to_string(o.slots().layer());
  if (o.slots().layer() == ResNetLayer::Branching) stream << ", lambda=" << o.slots().lambda();
  if (o.slots().strided_slots()) stream << ", strided_slots=true";
  stream << ")";
}

}  // namespace convnn::models
