// Float64 finite-difference checks of each layer with respect to its input and every parameter
// (aggregation kernel, bias, projection and convolution weights). Inputs are random and small, so
// no two candidates come within the 1e-6 step of a tie.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "convnn/nn/modules/convnn.h"
#include "support/gradcheck.h"

namespace {

using namespace convnn::nn;
using convnn::Similarity;
using convnn::testing::GradCheck;

at::Tensor randn(c10::IntArrayRef shape, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, generator, at::TensorOptions().dtype(at::kDouble));
}

// GradCheck hands the function perturbed copies of its inputs, but a module reads its own
// parameters, so the function first writes the copies it is given into them (or the original
// values back, when it is given the parameter itself).
template <typename Module>
::testing::AssertionResult LayerGradCheck(Module& module, const at::Tensor& input) {
  module->to(torch::kDouble);
  const auto parameters = module->parameters();
  std::vector<at::Tensor> originals;
  std::vector<at::Tensor> inputs{input.to(at::kDouble).requires_grad_()};
  for (const auto& p : parameters) {
    originals.push_back(p.detach().clone());
    inputs.push_back(p);
  }
  const auto load = [&](const std::vector<at::Tensor>& xs) {
    torch::NoGradGuard no_grad;
    for (size_t j = 0; j < parameters.size(); ++j) {
      auto p = parameters[j];
      p.copy_(xs[j + 1].is_same(p) ? originals[j] : xs[j + 1]);
    }
  };
  auto result = GradCheck(
      [&](const std::vector<at::Tensor>& xs) {
        load(xs);
        return module->forward(xs[0]);
      },
      inputs);
  load(inputs);
  return result;
}

TEST(LayerGradients, ConvNN1dStandardWithBiasAndPadding) {
  ConvNN1d layer(ConvNN1dOptions(2, 3, 3).padding(1).bias(true));
  EXPECT_TRUE(LayerGradCheck(layer, randn({2, 2, 6}, 1)));
}

TEST(LayerGradients, ConvNN1dDepthwiseGaussianSoftmaxIndexOrder) {
  ConvNN1d layer(ConvNN1dOptions(2, 2, 3)
                     .similarity(Similarity::Gaussian)
                     .aggregation(Aggregation::Depthwise)
                     .rho(Rho::Softmax)
                     .temperature(0.5)
                     .slot_order(SlotOrder::Index)
                     .bias(true));
  EXPECT_TRUE(LayerGradCheck(layer, randn({1, 2, 6}, 2)));
}

TEST(LayerGradients, ConvNN2dWithPadding) {
  ConvNN2d layer(ConvNN2dOptions(2, 2, 4).padding(1).bias(true));
  EXPECT_TRUE(LayerGradCheck(layer, randn({1, 2, 3, 3}, 3)));
}

TEST(LayerGradients, ConvNN2dWithCoordinatesAndAlpha) {
  ConvNN2d layer(ConvNN2dOptions(2, 3, 4)
                     .similarity(Similarity::Gaussian)
                     .coordinates(true)
                     .alpha(0.5)
                     .padding(1)
                     .rho(Rho::Softmax));
  EXPECT_TRUE(LayerGradCheck(layer, randn({1, 2, 3, 3}, 4)));
}

TEST(LayerGradients, ConvNN2dWithLinearProjectionsAndHeads) {
  ConvNN2d layer(ConvNN2dOptions(2, 2, 3)
                     .projection(Projection::Linear)
                     .qk_channels(4)
                     .projection_bias(true)
                     .heads(2)
                     .similarity(Similarity::ScaledDot)
                     .rho(Rho::Softmax)
                     .kernel_per_head(true)
                     .bias(true));
  EXPECT_TRUE(LayerGradCheck(layer, randn({1, 2, 3, 3}, 5)));
}

TEST(LayerGradients, ConvNNAttentionSoftmaxDepthwiseSharedKernel) {
  ConvNNAttention layer(ConvNNAttentionOptions(4, 2, 3).qkv_bias(true).out_bias(true));
  EXPECT_TRUE(LayerGradCheck(layer, randn({1, 4, 4}, 6)));
}

TEST(LayerGradients, ConvNNAttentionPerHeadKernelWithBias) {
  ConvNNAttention layer(ConvNNAttentionOptions(4, 2, 3).kernel_per_head(true).bias(true));
  EXPECT_TRUE(LayerGradCheck(layer, randn({1, 4, 4}, 7)));
}

TEST(LayerGradients, ConvNNAttentionCausalWithShortRows) {
  // k = 3 with a causal mask: the first two rows have fewer valid candidates than k.
  ConvNNAttention layer(ConvNNAttentionOptions(4, 2, 3).causal(true));
  EXPECT_TRUE(LayerGradCheck(layer, randn({1, 4, 4}, 8)));
}

TEST(LayerGradients, ConvNNAttentionStandardAggregationCosineMean) {
  ConvNNAttention layer(ConvNNAttentionOptions(4, 2, 2)
                            .aggregation(Aggregation::Standard)
                            .similarity(Similarity::Cosine)
                            .rho(Rho::Mean)
                            .kernel_init(KernelInit::Default));
  EXPECT_TRUE(LayerGradCheck(layer, randn({1, 4, 4}, 9)));
}

TEST(LayerGradients, BranchingConv2dBothBranchesAndTheMix) {
  BranchingConv2d layer(BranchingConv2dOptions(2, 4, 4).lambda(0.5));
  EXPECT_TRUE(LayerGradCheck(layer, randn({1, 2, 3, 3}, 10)));
}

}  // namespace
