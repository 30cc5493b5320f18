// ViT with MHSA, KVT and ConvNN attention: exact parameter counts (timm's ViT-B/16 and the paper
// authors' variant), the attention identity at the block level, and errors.
#include "convnn/models/vit.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/models/registry.h"
#include "convnn/nn/modules/convnn.h"
#include "support/assert_close.h"

namespace vit_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

using namespace convnn::models;
namespace cnn = convnn::nn;
using convnn::testing::AllClose;

ModelConfig attention_config(ViTAttention attention, int64_t k = 9, bool paper = false) {
  ModelConfig config;
  config.vit.attention = attention;
  config.convnn.k = k;
  config.vit.paper = paper;
  return config;
}

int64_t parameters_of(const std::string& name, const ModelConfig& config = {}) {
  return build_model(name, config).parameter_count();
}

constexpr int64_t kViTBase = 86'567'656;
constexpr int64_t kViTBasePaper = 86'379'496;

TEST(ViT, PresetsMatchTimmParameterCounts) {
  EXPECT_EQ(parameters_of("vit_tiny"), 5'717'416);
  EXPECT_EQ(parameters_of("vit_small"), 22'050'664);
  EXPECT_EQ(parameters_of("vit_base"), kViTBase);
  const auto tiny = build_model("vit_tiny").get<VisionTransformerImpl>();
  EXPECT_EQ(tiny->options.embed_dim(), 192);
  EXPECT_EQ(tiny->options.depth(), 12);
  EXPECT_EQ(tiny->options.num_heads(), 3);
  const auto small = build_model("vit_small").get<VisionTransformerImpl>();
  EXPECT_EQ(small->options.embed_dim(), 384);
  EXPECT_EQ(small->options.num_heads(), 6);
}

TEST(ViT, PaperVariantParameterCount) {
  const auto model = build_model("vit_base", attention_config(ViTAttention::MHSA, 9, true));
  EXPECT_EQ(model.parameter_count(), kViTBasePaper);
  const auto net = model.get<VisionTransformerImpl>();
  EXPECT_TRUE(net->norm.is_empty());
  EXPECT_FALSE(net->patch_norm.is_empty());
  EXPECT_EQ(net->named_buffers().size(), 1u);  // the fixed sinusoidal encoding
  EXPECT_EQ(net->named_parameters().find("pos_embed"), nullptr);
}

TEST(ViT, ConvNNAttentionAdds12x64xKParameters) {
  for (const int64_t k : {9, 25}) {
    EXPECT_EQ(parameters_of("vit_base", attention_config(ViTAttention::ConvNN, k, true)),
              kViTBasePaper + 12 * 64 * k)
        << "k = " << k;
    EXPECT_EQ(parameters_of("vit_base", attention_config(ViTAttention::ConvNN, k)), kViTBase + 12 * 64 * k)
        << "k = " << k;
  }
}

TEST(ViT, KVTHasAFixedKernelAndMHSAsParameterCount) {
  EXPECT_EQ(parameters_of("vit_base", attention_config(ViTAttention::KVT, 25, true)), kViTBasePaper);
  const auto model = build_model("vit_base", attention_config(ViTAttention::KVT, 25));
  EXPECT_EQ(model.parameter_count(), kViTBase);
  const auto net = model.get<VisionTransformerImpl>();
  const auto& block = net->blocks->at<TransformerBlockImpl>(0);
  const auto attention = block.attn.ptr<cnn::ConvNNAttentionImpl>();
  EXPECT_FALSE(attention->options.learnable_kernel());
  EXPECT_TRUE(torch::equal(attention->kernel, torch::ones({64, 25})));
  EXPECT_EQ(attention->options.similarity(), convnn::Similarity::ScaledDot);
  EXPECT_EQ(attention->options.rho(), cnn::Rho::Softmax);
}

TEST(ViT, SinusoidalEncoding) {
  const auto pe = sinusoidal_position_encoding(5, 6);
  ASSERT_EQ(pe.sizes(), (std::vector<int64_t>{5, 6}));
  EXPECT_NEAR(pe[3][0].item<double>(), std::sin(3.0), 1e-6);
  EXPECT_NEAR(pe[3][1].item<double>(), std::cos(3.0), 1e-6);
  EXPECT_NEAR(pe[2][4].item<double>(), std::sin(2.0 / std::pow(10000.0, 4.0 / 6.0)), 1e-6);
}

TEST(ViT, SelfAttentionIsSoftmaxAttention) {
  SelfAttention attention(SelfAttentionOptions(8, 2));
  const auto x = torch::randn({2, 5, 8});
  const auto qkv = attention->qkv(x).reshape({2, 5, 3, 2, 4}).permute({2, 0, 3, 1, 4});
  const auto weights = torch::softmax(torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) / 2.0, -1);
  const auto expected = attention->proj(torch::matmul(weights, qkv[2]).transpose(1, 2).reshape({2, 5, 8}));
  EXPECT_TRUE(AllClose(attention(x), expected, 1e-5));
}

// With K = N, softmax rho and a kernel of ones, ConvNN attention is MHSA (Theorem 3.1): a ConvNN
// block given the MHSA block's weights computes the same function.
TEST(ViT, ConvNNBlockWithKEqualNIsTheMHSABlock) {
  const int64_t dim = 16, heads = 4, tokens = 7;
  TransformerBlock mhsa(TransformerBlockOptions(dim, heads));
  TransformerBlock convnn(TransformerBlockOptions(dim, heads)
                              .attention(ViTAttention::ConvNN)
                              .convnn(cnn::ConvNNAttentionOptions(dim, heads, tokens)));
  {
    torch::NoGradGuard no_grad;
    const auto source = mhsa->named_parameters();
    for (auto& item : convnn->named_parameters()) {
      const auto& name = item.key();
      if (const auto* p = source.find(name)) {
        item.value().copy_(*p);
      } else if (name.rfind("attn.", 0) == 0 && name.find("_projection") != std::string::npos) {
        const bool weight = name.find("weight") != std::string::npos;
        const auto suffix = weight ? ".weight" : ".bias";
        if (name.find("output") != std::string::npos) {
          item.value().copy_(source[std::string("attn.proj") + suffix]);
        } else {
          const int64_t chunk = name.find("query") != std::string::npos ? 0
                                : name.find("key") != std::string::npos ? 1
                                                                        : 2;
          item.value().copy_(source[std::string("attn.qkv") + suffix].chunk(3, 0)[chunk]);
        }
      } else {
        ASSERT_EQ(name, "attn.kernel");
      }
    }
  }
  const auto x = torch::randn({2, tokens, dim});
  EXPECT_TRUE(AllClose(convnn(x), mhsa(x), 1e-5));
}

TEST(ViT, AnyImageSizePatchSizeAndChannels) {
  ModelConfig config;
  config.image_size = 24;
  config.vit.patch_size = 6;
  config.in_channels = 1;
  config.num_classes = 7;
  config.vit.depth = 2;
  auto model = build_model("vit_tiny", config);
  model.module()->eval();
  torch::NoGradGuard no_grad;
  EXPECT_EQ(model(torch::randn({2, 1, 24, 24})).sizes(), (std::vector<int64_t>{2, 7}));
  EXPECT_THROW(model(torch::randn({2, 1, 32, 32})), c10::Error);
}

TEST(ViT, KLargerThanTheTokensIsAClearError) {
  auto config = attention_config(ViTAttention::ConvNN, 9);
  config.image_size = 32;  // 2 x 2 patches + the class token: N = 5
  try {
    build_model("vit_tiny", config);
    FAIL() << "expected a c10::Error";
  } catch (const c10::Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("k = 9"), std::string::npos) << message;
    EXPECT_NE(message.find("N = 5"), std::string::npos) << message;
  }
  config.image_size = 30;
  EXPECT_THROW(build_model("vit_tiny", config), c10::Error);  // not a multiple of the patch
}

TEST(ViT, DropPathDropsWholeSamplesInTrainingOnly) {
  DropPath drop(0.5);
  const auto x = torch::ones({64, 3, 4});
  drop->eval();
  EXPECT_TRUE(torch::equal(drop(x), x));
  drop->train();
  const auto y = drop(x);
  const auto per_sample = y.flatten(1);
  EXPECT_TRUE(torch::all((per_sample == 0).all(1) | (per_sample == 2).all(1)).item<bool>());
  EXPECT_GT((per_sample == 0).all(1).sum().item<int64_t>(), 0);
}

TEST(ViT, StochasticDepthGrowsLinearly) {
  ModelConfig config;
  config.vit.drop_path = 0.1;
  const auto net = build_model("vit_tiny", config).get<VisionTransformerImpl>();
  EXPECT_EQ(net->blocks->at<TransformerBlockImpl>(0).drop_path->probability, 0.0);
  EXPECT_NEAR(net->blocks->at<TransformerBlockImpl>(11).drop_path->probability, 0.1, 1e-12);
}

}  // namespace

}  // namespace vit_test
