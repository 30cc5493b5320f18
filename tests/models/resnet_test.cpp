// ResNet with ConvNN and branching layers: exact parameter counts of the paper's models, which
// slots are replaced, the paper's layer defaults, the small stem and errors.
#include "convnn/models/resnet.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>

#include "convnn/models/registry.h"
#include "convnn/nn/modules/convnn.h"

namespace {

using namespace convnn::models;
namespace cnn = convnn::nn;

int64_t parameters_of(const std::string& name, const ModelConfig& config = {}) {
  return build_model(name, config).parameter_count();
}

ModelConfig with_layer(ResNetLayer layer, int64_t k = 9) {
  ModelConfig config;
  config.resnet.layer = layer;
  config.convnn.k = k;
  return config;
}

TEST(ResNet, ParameterCountsMatchTorchvision) {
  EXPECT_EQ(parameters_of("resnet18"), 11'689'512);
  EXPECT_EQ(parameters_of("resnet34"), 21'797'672);
  EXPECT_EQ(parameters_of("resnet50"), 25'557'032);
}

TEST(ResNet, ParameterCountsOfThePapersResNet50Variants) {
  EXPECT_EQ(parameters_of("resnet50", with_layer(ResNetLayer::Branching, 9)), 26'474'760);
  EXPECT_EQ(parameters_of("resnet50", with_layer(ResNetLayer::Branching, 16)), 29'671'688);
  // A ConvNN layer [C', C, K=9] without bias has exactly the 3x3 convolution's parameters.
  EXPECT_EQ(parameters_of("resnet50", with_layer(ResNetLayer::ConvNN, 9)), 25'557'032);
  // Random candidates (r = 32) change the search, not the parameters.
  auto random = with_layer(ResNetLayer::Branching, 9);
  random.convnn.num_candidates = 32;
  EXPECT_EQ(parameters_of("resnet50", random), 26'474'760);
}

TEST(ResNet, ReplacesExactlyTheStrideOne3x3Convolutions) {
  for (const auto& [name, slots] :
       std::vector<std::pair<std::string, size_t>>{{"resnet18", 13}, {"resnet34", 29}, {"resnet50", 13}}) {
    const auto model = build_model(name, with_layer(ResNetLayer::ConvNN));
    const auto layers = model.get<ResNetImpl>()->slot_layers();
    EXPECT_EQ(layers.size(), slots) << name;
    for (const auto& layer : layers)
      EXPECT_NE(dynamic_cast<cnn::ConvNN2dImpl*>(layer.get()), nullptr) << name;
    size_t convnn = 0;
    for (const auto& module : model.module()->modules()) convnn += module->as<cnn::ConvNN2d>() != nullptr;
    EXPECT_EQ(convnn, slots) << name << ": the stem and the strided 3x3 convolutions stay Conv2d";
  }
  const auto net = build_model("resnet50", with_layer(ResNetLayer::Branching)).get<ResNetImpl>();
  EXPECT_NE(net->conv1->as<torch::nn::Conv2d>(), nullptr);
  // layer2.0's 3x3 convolution has stride 2: kept.
  EXPECT_NE(net->stages[1]->at<ResidualBlockImpl>(0).convs[1].ptr()->as<torch::nn::Conv2d>(), nullptr);
  EXPECT_NE(net->stages[1]->at<ResidualBlockImpl>(1).convs[1].ptr()->as<cnn::BranchingConv2d>(), nullptr);
}

// strided_slots: the stride-2 3x3 convolutions become ConvNN layers of stride 2 too (resnet18: 3
// more slots, 16), with the convolutions' parameter count (a [C',C,9] kernel without bias); the
// map shrinks as with the convolutions, and each strided slot's aggregation costs its strided
// convolution's MACs.
TEST(ResNet, StridedSlotsReplaceTheStrideTwo3x3ConvolutionsToo) {
  auto config = with_layer(ResNetLayer::ConvNN);
  config.resnet.strided_slots = true;
  const auto model = build_model("resnet18", config);
  const auto net = model.get<ResNetImpl>();
  EXPECT_EQ(net->slot_layers().size(), 16u);
  const auto* strided = net->stages[1]->at<ResidualBlockImpl>(0).convs[0].ptr()->as<cnn::ConvNN2d>();
  ASSERT_NE(strided, nullptr) << "layer2.0.conv1";
  EXPECT_EQ(*strided->options.stride(), (std::array<int64_t, 2>{2, 2}));
  EXPECT_EQ(model.parameter_count(), 11'689'512);
  config.num_classes = 10;
  config.image_size = 32;
  config.resnet.small_stem = true;
  config.resnet.width = 8;
  auto small = build_model("resnet18", config);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(small.forward(torch::randn({2, 3, 32, 32})).sizes(), (std::vector<int64_t>{2, 10}));
  auto conv_config = config;
  conv_config.resnet.layer = ResNetLayer::Conv;
  conv_config.resnet.strided_slots = false;
  int64_t convnn_macs = 0, conv_macs = 0;
  for (const auto& e : small.cost().entries()) {
    if (e.layer == "layer2.0.conv1" && e.op == "aggregation") convnn_macs += e.cost.macs;
  }
  for (const auto& e : build_model("resnet18", conv_config).cost().entries()) {
    if (e.layer == "layer2.0.conv1") conv_macs += e.cost.macs;
  }
  EXPECT_GT(conv_macs, 0);
  EXPECT_EQ(convnn_macs, conv_macs);
  auto conv_with_strided = conv_config;
  conv_with_strided.resnet.strided_slots = true;
  EXPECT_THROW(build_model("resnet18", conv_with_strided), c10::Error) << "strided_slots needs a ConvNN layer";
}

TEST(ResNet, ConvNNLayersUseThePapersDefaults) {
  const auto net = build_model("resnet50", with_layer(ResNetLayer::ConvNN)).get<ResNetImpl>();
  const auto& o = net->slot_layers().front()->as<cnn::ConvNN2d>()->options;
  EXPECT_EQ(o.k(), 9);
  EXPECT_EQ(o.padding(), 1);
  EXPECT_EQ(o.similarity(), convnn::Similarity::Cosine);
  EXPECT_EQ(o.rho(), cnn::Rho::Uniform);
  EXPECT_EQ(o.aggregation(), cnn::Aggregation::Standard);
  EXPECT_EQ(o.projection(), cnn::Projection::Identity);
  EXPECT_FALSE(o.bias());
  EXPECT_EQ(o.num_candidates(), 0);
  EXPECT_EQ(o.in_channels(), 64);
  EXPECT_EQ(o.out_channels(), 64);
}

TEST(ResNet, BranchingLayerSplitsChannelsByLambda) {
  auto config = with_layer(ResNetLayer::Branching);
  config.resnet.lambda = 0.25;
  config.convnn.num_candidates = 32;
  const auto net = build_model("resnet50", config).get<ResNetImpl>();
  const auto* layer = net->slot_layers().back()->as<cnn::BranchingConv2d>();
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ(layer->convnn_channels(), 128);  // round(0.25 * 512)
  EXPECT_EQ(layer->convnn_branch->options.num_candidates(), 32);
  EXPECT_TRUE(layer->conv_branch->options.bias());
}

TEST(ResNet, SmallStemAndAnyInputChannelCount) {
  ModelConfig config;
  config.resnet.small_stem = true;
  config.in_channels = 1;
  config.num_classes = 10;
  config.resnet.width = 8;
  config.image_size = 28;
  const auto model = build_model("resnet18", config);
  const auto net = model.get<ResNetImpl>();
  EXPECT_EQ(net->conv1->options.kernel_size()->at(0), 3);
  EXPECT_EQ(net->conv1->options.stride()->at(0), 1);
  EXPECT_TRUE(net->maxpool.is_empty());
  net->eval();
  torch::NoGradGuard no_grad;
  EXPECT_EQ(net->forward(torch::randn({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));
}

TEST(ResNet, TorchvisionInitialisation) {
  const auto net = build_model("resnet50", with_layer(ResNetLayer::Branching)).get<ResNetImpl>();
  EXPECT_TRUE(torch::equal(net->bn1->weight, torch::ones(64)));
  EXPECT_TRUE(torch::equal(net->bn1->bias, torch::zeros(64)));
  // Kaiming-normal, fan_out, ReLU gain: std = sqrt(2 / (C_out * 3 * 3)) for layer4's 3x3.
  const auto* branch = net->slot_layers().back()->as<cnn::BranchingConv2d>();
  const double expected = std::sqrt(2.0 / (256.0 * 9.0));
  EXPECT_NEAR(branch->conv_branch->weight.std().item<double>(), expected, 0.05 * expected);
}

TEST(ResNet, ClearErrors) {
  auto depthwise = with_layer(ResNetLayer::Branching);
  depthwise.convnn.aggregation = convnn::nn::Aggregation::Depthwise;
  EXPECT_THROW(
      {
        try {
          build_model("resnet18", depthwise);
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("depthwise"), std::string::npos) << e.what();
          throw;
        }
      },
      c10::Error);
  // At 32 px the ImageNet stem leaves layer4 a 1x1 map: 9 candidates after padding 1, fewer than K.
  auto large_k = with_layer(ResNetLayer::ConvNN, 16);
  large_k.image_size = 32;
  try {
    build_model("resnet50", large_k);
    FAIL() << "expected a c10::Error";
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("layer4"), std::string::npos) << message;
    EXPECT_NE(message.find("k = 16"), std::string::npos) << message;
  }
  auto bad_lambda = with_layer(ResNetLayer::Branching);
  bad_lambda.resnet.lambda = 1.5;
  EXPECT_THROW(build_model("resnet50", bad_lambda), c10::Error);
  EXPECT_THROW(ResNet(ResNetOptions(101)), c10::Error);
}

// The size check is its own walk of the layer geometry, not a side effect of counting costs: it
// accepts the smallest image whose last stage still gives every query k candidates, rejects the
// next smaller one naming the first layer that no longer fits, and the branching layer's check
// names its ConvNN branch.
TEST(ResNet, CheckImageSizeFindsTheFirstLayerWithTooFewCandidates) {
  auto convnn_config = with_layer(ResNetLayer::ConvNN, 16);
  convnn_config.resnet.small_stem = true;  // no stride in the stem: layer4 sees a (size / 8) map
  const ResNet convnn_net(resnet_options("resnet18", convnn_config));
  // layer4.0.conv1 is the stride-2 Conv2d; conv2 is the first ConvNN2d there. Padding 1 makes an
  // s x s map (s+2)^2 candidates: s = 1 gives 9 < 16, s = 2 gives 16.
  EXPECT_NO_THROW(convnn_net->check_image_size(16, 16));
  try {
    convnn_net->check_image_size(8, 8);
    FAIL() << "expected a c10::Error";
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("layer4.0.conv2"), std::string::npos) << message;
    EXPECT_NE(message.find("1x1 map with padding 1"), std::string::npos) << message;
    EXPECT_NE(message.find("k = 16"), std::string::npos) << message;
  }
  auto branching_config = convnn_config;
  branching_config.resnet.layer = ResNetLayer::Branching;
  const ResNet branching_net(resnet_options("resnet18", branching_config));
  try {
    branching_net->check_image_size(8, 8);
    FAIL() << "expected a c10::Error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer4.0.conv2.convnn_branch"), std::string::npos) << e.what();
  }
  EXPECT_THROW(convnn_net->check_image_size(0, 16), c10::Error);
}

TEST(ResNet, DepthwiseConvNNKeepsChannels) {
  auto config = with_layer(ResNetLayer::ConvNN);
  config.convnn.aggregation = convnn::nn::Aggregation::Depthwise;
  config.resnet.small_stem = true;
  config.resnet.width = 8;
  config.image_size = 16;
  config.num_classes = 3;
  auto model = build_model("resnet18", config);
  const auto* layer = model.get<ResNetImpl>()->slot_layers().front()->as<cnn::ConvNN2d>();
  EXPECT_EQ(layer->kernel.sizes(), (std::vector<int64_t>{8, 9}));
  model.module()->eval();
  torch::NoGradGuard no_grad;
  EXPECT_EQ(model(torch::randn({1, 3, 16, 16})).sizes(), (std::vector<int64_t>{1, 3}));
}

}  // namespace
