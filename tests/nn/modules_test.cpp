// The layers follow the LibTorch frontend conventions: options, reset(), pretty_print, parameters,
// serialisation, and agreement with the functional form.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <functional>
#include <sstream>

#include "convnn/nn/modules/convnn.h"
#include "nn/modules/layer_forward.h"
#include "support/assert_close.h"

namespace {

using namespace convnn::nn;
using convnn::Similarity;
using convnn::testing::AllClose;

std::string printed(const torch::nn::Module& module) {
  std::ostringstream stream;
  module.pretty_print(stream);
  return stream.str();
}

int64_t parameter_count(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const auto& p : module.parameters()) total += p.numel();
  return total;
}

template <typename ModuleHolder>
void expect_save_load_round_trip(ModuleHolder original, ModuleHolder fresh, const torch::Tensor& input) {
  std::stringstream buffer;
  torch::save(original, buffer);
  torch::load(fresh, buffer);
  original->eval();
  fresh->eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(AllClose(fresh(input), original(input), 0.0));
}

// As torch.nn's Conv1d, Conv2d and MultiheadAttention: an input without its batch dimension is one
// sample, with the output of the batch of one, bit for bit.
TEST(Layers, AnUnbatchedInputIsOneSampleAsTorchNnConvolutionsTakeIt) {
  torch::manual_seed(12);
  ConvNN1d conv1d(ConvNN1dOptions(3, 4, 3).padding(1));
  ConvNN2d conv2d(ConvNN2dOptions(3, 4, 9).padding(1));
  BranchingConv2d branching(BranchingConv2dOptions(3, 6, 9));
  ConvNNAttention attention(ConvNNAttentionOptions(8, 2, 3));
  const auto line = torch::randn({3, 7}), image = torch::randn({3, 5, 6}), tokens = torch::randn({6, 8});
  EXPECT_TRUE(torch::equal(conv1d(line), conv1d(line.unsqueeze(0)).squeeze(0)));
  EXPECT_TRUE(torch::equal(conv2d(image), conv2d(image.unsqueeze(0)).squeeze(0)));
  EXPECT_TRUE(torch::equal(branching(image), branching(image.unsqueeze(0)).squeeze(0)));
  EXPECT_TRUE(torch::equal(attention(tokens), attention(tokens.unsqueeze(0)).squeeze(0)));
  EXPECT_EQ(conv2d(image).sizes(), (std::vector<int64_t>{4, 5, 6}));
}

TEST(ConvNN2d, PaperDefaultsAreIdentityCosineUniformStandardWithoutBias) {
  ConvNN2d layer(ConvNN2dOptions(8, 16, 9).padding(1));
  EXPECT_EQ(layer->options.similarity(), Similarity::Cosine);
  EXPECT_EQ(layer->options.rho(), Rho::Uniform);
  EXPECT_EQ(layer->options.aggregation(), Aggregation::Standard);
  EXPECT_FALSE(layer->options.bias());
  EXPECT_EQ(layer->kernel.sizes(), (std::vector<int64_t>{16, 8, 9}));
  EXPECT_FALSE(layer->bias.defined());
  // Same parameter count as the 3x3 convolution it replaces in ResNet.
  EXPECT_EQ(parameter_count(*layer), 16 * 8 * 9);
}

TEST(ConvNN2d, PrettyPrintNamesTheLayerAndItsOptions) {
  ConvNN2d layer(ConvNN2dOptions(3, 8, 9).padding(1).num_candidates(16));
  const auto text = printed(*layer);
  EXPECT_NE(text.find("convnn::ConvNN2d(3, 8, k=9"), std::string::npos) << text;
  EXPECT_NE(text.find("similarity=cosine"), std::string::npos) << text;
  EXPECT_NE(text.find("num_candidates=16"), std::string::npos) << text;
}

TEST(ConvNN2d, ForwardKeepsSpatialSizeWithSamePadding) {
  ConvNN2d layer(ConvNN2dOptions(3, 8, 9).padding(1));
  EXPECT_EQ(layer(torch::randn({2, 3, 5, 7})).sizes(), (std::vector<int64_t>{2, 8, 5, 7}));
}

TEST(ConvNN2d, ModuleEqualsFunctionalForm) {
  ConvNN2d layer(ConvNN2dOptions(4, 6, 5).padding(1).bias(true).similarity(Similarity::Dot));
  const auto input = torch::randn({2, 4, 5, 6});
  const auto expected = functional::conv_nn2d(
      input, layer->kernel, layer->bias,
      functional::ConvNNFuncOptions(5).padding(1).similarity(Similarity::Dot));
  EXPECT_TRUE(AllClose(layer(input), expected, 0.0));
}

TEST(ConvNN2d, SaveLoadRoundTripGivesIdenticalOutputs) {
  const auto options = ConvNN2dOptions(3, 4, 9).padding(1).bias(true).projection(Projection::Linear);
  expect_save_load_round_trip(ConvNN2d(options), ConvNN2d(options), torch::randn({2, 3, 4, 4}));
}

TEST(ConvNN2d, FixedKernelIsABufferOfOnesNotAParameter) {
  ConvNN2d layer(ConvNN2dOptions(4, 4, 9).aggregation(Aggregation::Depthwise).learnable_kernel(false));
  EXPECT_EQ(parameter_count(*layer), 0);
  EXPECT_TRUE(torch::equal(layer->kernel, torch::ones({4, 9})));
  EXPECT_EQ(layer->buffers().size(), 1u);
}

TEST(ConvNN2d, CloneIsADeepCopy) {
  ConvNN2d layer(ConvNN2dOptions(3, 4, 9).padding(1));
  auto copy = std::dynamic_pointer_cast<ConvNN2dImpl>(layer->clone());
  ASSERT_TRUE(copy);
  {
    torch::NoGradGuard no_grad;
    copy->kernel.fill_(0.5);
  }
  EXPECT_FALSE(torch::equal(copy->kernel, layer->kernel));
}

TEST(ConvNN3d, ForwardKeepsTheVolumeWithSamePaddingAndTakesOneSample) {
  torch::manual_seed(13);
  ConvNN3d layer(ConvNN3dOptions(3, 5, 27).padding(1).bias(true));
  const auto volume = torch::randn({2, 3, 3, 4, 5});
  EXPECT_EQ(layer(volume).sizes(), (std::vector<int64_t>{2, 5, 3, 4, 5}));
  EXPECT_TRUE(torch::equal(layer(volume[0]), layer(volume.narrow(0, 0, 1)).squeeze(0)));
  EXPECT_EQ(parameter_count(*layer), 5 * 3 * 27 + 5);
}

TEST(ConvNN3d, ModuleEqualsFunctionalFormAndPrintsItsName) {
  ConvNN3d layer(ConvNN3dOptions(4, 4, 7).aggregation(Aggregation::Depthwise).similarity(Similarity::L1));
  const auto input = torch::randn({2, 4, 2, 3, 4});
  const auto expected = functional::conv_nn3d(
      input, layer->kernel, {}, functional::ConvNNFuncOptions(7).similarity(Similarity::L1));
  EXPECT_TRUE(AllClose(layer(input), expected, 0.0));
  EXPECT_EQ(printed(*layer).rfind("convnn::ConvNN3d(4, 4, k=7", 0), 0u) << printed(*layer);
}

TEST(ConvNN3d, AWrongInputNamesTheLayerAndTheLayout) {
  ConvNN3d layer(ConvNN3dOptions(3, 4, 5));
  try {
    layer(torch::randn({3, 4, 5}));  // [C,H,W]: neither [B,C,D,H,W] nor one sample [C,D,H,W]
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("ConvNN3d: input must be 5-D [B,C,D,H,W] (or 4-D [C,D,H,W] for one sample)"),
              std::string::npos) << error.what();
  }
  try {
    functional::conv_nn3d(torch::randn({2, 3, 4, 5}), layer->kernel, {}, functional::ConvNNFuncOptions(5));
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("conv_nn3d: input must be 5-D [B,C,D,H,W]"), std::string::npos)
        << error.what();
  }
}

TEST(ConvNN3d, SaveLoadRoundTripGivesIdenticalOutputs) {
  const auto options = ConvNN3dOptions(3, 4, 8).padding(1).bias(true).projection(Projection::Linear);
  expect_save_load_round_trip(ConvNN3d(options), ConvNN3d(options), torch::randn({2, 3, 2, 3, 3}));
}

TEST(BranchingConv3d, KeepsTheVolumeAndHasTheParametersOfItsBranches) {
  torch::manual_seed(14);
  BranchingConv3d layer(BranchingConv3dOptions(4, 8).lambda(0.5));
  EXPECT_EQ(layer->options.convnn().k(), 27) << "K defaults to the 3x3x3 window's size";
  const auto volume = torch::randn({2, 4, 3, 4, 5});
  EXPECT_EQ(layer(volume).sizes(), (std::vector<int64_t>{2, 8, 3, 4, 5}));
  EXPECT_TRUE(torch::equal(layer(volume[1]), layer(volume.narrow(0, 1, 1)).squeeze(0)));
  // ConvNN branch 4 of 8 channels (standard kernel 4*4*27), 3x3x3 convolution 4*4*27 + 4, 1x1x1 mix 8*8 + 8.
  EXPECT_EQ(parameter_count(*layer), 4 * 4 * 27 + 4 * 4 * 27 + 4 + 8 * 8 + 8);
  EXPECT_EQ(printed(*layer).rfind("convnn::BranchingConv3d(4, 8, lambda=0.5", 0), 0u) << printed(*layer);
  try {
    layer(torch::randn({4, 5, 5}));
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("BranchingConv3d: input must be [B,C,D,H,W] (or [C,D,H,W] for one sample)"),
              std::string::npos) << error.what();
  }
}

TEST(BranchingConv3d, WithLambdaOneIsItsConvNNBranchThenTheMix) {
  torch::manual_seed(15);
  BranchingConv3d layer(BranchingConv3dOptions(3, 4, 8).lambda(1.0));
  ASSERT_FALSE(layer->conv_branch);
  const auto volume = torch::randn({1, 3, 3, 3, 4});
  const auto expected = torch::conv3d(layer->convnn_branch(volume), layer->mix->weight, layer->mix->bias);
  EXPECT_TRUE(AllClose(layer(volume), expected, 1e-6));
}

// Stride puts the queries on every s-th position: with one phase (no dilation), every query, its
// candidates and a fixed random-candidate draw are those of the unstrided layer, so the output is
// the unstrided output subsampled. Both ways of querying: a subset of the tokens (equal to
// rounding: the score GEMM has another shape, so its last bits may differ), and, with include_self,
// which needs every token a query, all of them (bitwise).
TEST(ConvNN2d, StrideIsTheUnstridedOutputSubsampled) {
  for (const bool include_self : {false, true}) {
    SCOPED_TRACE(include_self ? "include_self" : "a subset of the tokens as queries");
    torch::manual_seed(16);
    auto options = ConvNN2dOptions(3, 5, 4).padding(1).coordinates(true).alpha(0.5).num_candidates(20)
                       .include_self(include_self).seed(3).bias(true);
    ConvNN2d unstrided(options);
    ConvNN2d strided(options.stride({2, 3}));
    unstrided->to(torch::kDouble);
    strided->to(torch::kDouble);
    {
      torch::NoGradGuard no_grad;
      for (const auto& item : unstrided->named_parameters()) strided->named_parameters()[item.key()].copy_(item.value());
    }
    unstrided->eval();
    strided->eval();
    const auto x = torch::randn({2, 3, 7, 8}, torch::kDouble);
    torch::NoGradGuard no_grad;
    const auto expected = unstrided(x).slice(2, 0, c10::nullopt, 2).slice(3, 0, c10::nullopt, 3);
    const auto y = strided(x);
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 5, 4, 3})) << "ceil(7 / 2) x ceil(8 / 3)";
    if (include_self) {
      EXPECT_TRUE(torch::equal(y, expected));
    } else {
      EXPECT_TRUE(AllClose(y, expected, 1e-12));
    }
  }
}

TEST(ConvNN2d, StrideAndDilationAreCheckedAndPrinted) {
  EXPECT_NE(printed(*ConvNN2d(ConvNN2dOptions(3, 4, 9).stride({1, 2}).dilation(2))).find(", stride=[1, 2], dilation=[2, 2]"),
            std::string::npos) << printed(*ConvNN2d(ConvNN2dOptions(3, 4, 9).stride({1, 2}).dilation(2)));
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const c10::Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { ConvNN2d(ConvNN2dOptions(3, 4, 9).stride({0, 1})); })
                .find("ConvNN2d: stride must be at least 1 on every axis, got [0, 1]"),
            std::string::npos);
  EXPECT_NE(message([] { ConvNN2d(ConvNN2dOptions(3, 4, 9).dilation(-1)); })
                .find("ConvNN2d: dilation must be at least 1 on every axis"),
            std::string::npos);
  const auto kernel = torch::randn({4, 3, 9});
  const auto expect_error = [&](const std::function<void()>& f, const std::string& expected) {
    const auto got = message(f);
    EXPECT_NE(got.find(expected), std::string::npos) << "expected '" << expected << "', got: " << got;
  };
  expect_error([&] {
    functional::conv_nn2d(torch::randn({1, 3, 5, 5}), kernel, {}, functional::ConvNNFuncOptions(9).stride({1, 2, 3}));
  }, "conv_nn2d: stride must be one value or 2 (one per axis), got [1, 2, 3]");
  // A 5x5 map's smallest phase of the dilation-3 grid has 1 x 1 positions.
  expect_error([&] {
    functional::conv_nn2d(torch::randn({1, 3, 5, 5}), kernel, {}, functional::ConvNNFuncOptions(9).dilation({3}));
  }, "conv_nn2d (on a 5x5 map with padding 0, the smallest phase of the dilated grid): k must be in [1, 1]");
  expect_error([&] {
    functional::conv_nn(torch::randn({1, 6, 3}), torch::randn({1, 6, 3}), torch::randn({1, 6, 3}),
                        torch::randn({3, 2}), {}, functional::ConvNNFuncOptions(2).stride({2}));
  }, "conv_nn: stride = [2] and dilation = [1] apply to spatial inputs only");
}

TEST(BranchingConv2d, StrideAndDilationReachTheConvolutionBranch) {
  torch::manual_seed(17);
  BranchingConv2d layer(BranchingConv2dOptions(3, 6).convnn(ConvNN2dOptions(3, 6, 9).padding(2).stride(2).dilation(2)));
  EXPECT_EQ(layer(torch::randn({2, 3, 9, 8})).sizes(), (std::vector<int64_t>{2, 6, 5, 4}));
  EXPECT_EQ(*layer->conv_branch->options.stride(), (std::array<int64_t, 2>{2, 2}));
  EXPECT_EQ(*layer->conv_branch->options.dilation(), (std::array<int64_t, 2>{2, 2}));
}

TEST(ConvNN1d, ForwardShapeAndPerHeadKernel) {
  ConvNN1d layer(ConvNN1dOptions(8, 8, 3).heads(2).kernel_per_head(true).bias(true).padding(1));
  EXPECT_EQ(layer->kernel.sizes(), (std::vector<int64_t>{2, 4, 4, 3}));
  EXPECT_EQ(layer->bias.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(layer(torch::randn({3, 8, 10})).sizes(), (std::vector<int64_t>{3, 8, 10}));
}

TEST(ConvNNAttention, PaperDefaultsAreBiasFreeWithAKernelOfOnesSharedAcrossHeads) {
  ConvNNAttention attention(ConvNNAttentionOptions(768, 12, 9));
  EXPECT_EQ(attention->kernel.sizes(), (std::vector<int64_t>{64, 9}));
  EXPECT_TRUE(torch::equal(attention->kernel, torch::ones({64, 9})));
  // Four bias-free 768x768 projections plus the 64*K kernel: what ConvNN attention adds to ViT.
  EXPECT_EQ(parameter_count(*attention), 4 * 768 * 768 + 64 * 9);
}

TEST(ConvNNAttention, ForwardShapeTrainAndEvalAndSaveLoad) {
  const auto options = ConvNNAttentionOptions(16, 4, 5).dropout(0.1).qkv_bias(true);
  ConvNNAttention attention(options);
  const auto input = torch::randn({2, 7, 16});
  attention->train();
  EXPECT_EQ(attention(input).sizes(), input.sizes());
  expect_save_load_round_trip(attention, ConvNNAttention(options), input);
  EXPECT_NE(printed(*attention).find("convnn::ConvNNAttention(embed_dim=16, num_heads=4, k=5"),
            std::string::npos);
}

// The projections as timm's qkv: one product of the concatenated weights, whose three thirds are the
// three projections (to rounding: one GEMM sums in its own blocking), where the weights share a
// dtype and device and all or none have a bias; three products otherwise, bitwise each linear.
TEST(ConvNNAttention, TheQueryKeyAndValueProjectionsAreOneMatrixProductWhereTheWeightsAllow) {
  using convnn::nn::detail::AttentionTensors;
  torch::manual_seed(3);
  const auto input = torch::randn({2, 7, 16}, torch::kDouble);
  const auto weight = [] { return torch::randn({16, 16}, torch::kDouble); };
  const auto bias = [] { return torch::randn({16}, torch::kDouble); };
  for (const bool with_bias : {false, true}) {
    AttentionTensors tensors;
    tensors.query = {weight(), with_bias ? bias() : torch::Tensor()};
    tensors.key = {weight(), with_bias ? bias() : torch::Tensor()};
    tensors.value = {weight(), with_bias ? bias() : torch::Tensor()};
    const auto [queries, keys, values] = convnn::nn::detail::project_qkv(tensors, input);
    EXPECT_TRUE(queries.is_alias_of(keys) && keys.is_alias_of(values)) << "thirds of one product";
    const std::array<const convnn::nn::detail::LinearTensors*, 3> linears{&tensors.query, &tensors.key, &tensors.value};
    const std::array<at::Tensor, 3> got{queries, keys, values};
    for (size_t i = 0; i < 3; ++i) {
      const auto& l = *linears[i];
      EXPECT_TRUE(torch::allclose(got[i], torch::nn::functional::linear(input, l.weight, l.bias), 1e-12, 1e-12));
    }
  }
  AttentionTensors mixed;
  mixed.query = {weight(), bias()};
  mixed.key = {weight(), torch::Tensor()};
  mixed.value = {weight(), bias()};
  const auto [queries, keys, values] = convnn::nn::detail::project_qkv(mixed, input);
  EXPECT_FALSE(queries.is_alias_of(keys)) << "a bias on some projections only: three products";
  EXPECT_TRUE(torch::equal(keys, torch::nn::functional::linear(input, mixed.key.weight)));
}

TEST(BranchingConv2d, SplitsChannelsByLambdaWithTheConvNNBranchFirst) {
  BranchingConv2d layer(BranchingConv2dOptions(8, 10, 9).lambda(0.3));
  EXPECT_EQ(layer->convnn_channels(), 3);
  EXPECT_EQ(layer->convnn_branch->options.out_channels(), 3);
  EXPECT_EQ(layer->conv_branch->options.out_channels(), 7);
  EXPECT_EQ(layer(torch::randn({2, 8, 6, 6})).sizes(), (std::vector<int64_t>{2, 10, 6, 6}));
}

TEST(BranchingConv2d, ParameterCountMatchesThePaperLayout) {
  // ConvNN branch [C/2, C, K] without bias, 3x3 conv branch with bias, 1x1 mix with bias.
  const int64_t c = 64;
  BranchingConv2d layer(BranchingConv2dOptions(c, c, 9));
  EXPECT_EQ(parameter_count(*layer), (c / 2) * c * 9 + (c / 2) * c * 9 + c / 2 + c * c + c);
}

TEST(BranchingConv2d, LambdaZeroAndOneBuildOneBranchAndKeepTheMix) {
  BranchingConv2d conv_only(BranchingConv2dOptions(4, 6).lambda(0.0));
  EXPECT_TRUE(conv_only->convnn_branch.is_empty());
  EXPECT_FALSE(conv_only->conv_branch.is_empty());
  BranchingConv2d convnn_only(BranchingConv2dOptions(4, 6).lambda(1.0));
  EXPECT_FALSE(convnn_only->convnn_branch.is_empty());
  EXPECT_TRUE(convnn_only->conv_branch.is_empty());
  EXPECT_FALSE(convnn_only->mix.is_empty());
  EXPECT_EQ(convnn_only(torch::randn({1, 4, 5, 5})).sizes(), (std::vector<int64_t>{1, 6, 5, 5}));
}

TEST(BranchingConv2d, SaveLoadRoundTripAndPrettyPrint) {
  const auto options = BranchingConv2dOptions(4, 6, 9);
  BranchingConv2d layer(options);
  expect_save_load_round_trip(layer, BranchingConv2d(options), torch::randn({1, 4, 5, 5}));
  EXPECT_NE(printed(*layer).find("convnn::BranchingConv2d(4, 6, lambda=0.5"), std::string::npos);
}

}  // namespace
