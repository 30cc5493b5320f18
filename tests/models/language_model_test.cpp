// The decoder-only language model: causal (no position sees a later token), its decoding steps
// equal the full forward, generation is seeded and follows its sampling rule, and the registry's
// lm_* models take their options and refuse the image ones.
#include "convnn/models/language_model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/models/registry.h"
#include "support/error_message.h"

namespace {

using namespace convnn::models;
using convnn::testing::error_of;

struct Variant {
  const char* label;
  ViTAttention attention;
  int64_t kv_heads;
};

const Variant kVariants[] = {{"mhsa", ViTAttention::MHSA, 0},
                             {"mhsa_grouped", ViTAttention::MHSA, 1},
                             {"convnn", ViTAttention::ConvNN, 0},
                             {"convnn_grouped", ViTAttention::ConvNN, 1},
                             {"kvt", ViTAttention::KVT, 0}};

LanguageModel small_model(const Variant& v, int64_t context = 24) {
  torch::manual_seed(0);
  auto options = LanguageModelOptions(32, 2, 2, context)
                     .vocab_size(50)
                     .attention(v.attention)
                     .num_kv_heads(v.kv_heads)
                     .convnn(convnn::nn::ConvNNAttentionOptions(1, 1, 5));
  LanguageModel model(options);
  model->eval();
  return model;
}

class LanguageModelVariants : public ::testing::TestWithParam<Variant> {};

TEST_P(LanguageModelVariants, NoPositionSeesALaterToken) {
  auto model = small_model(GetParam());
  model->to(at::kDouble);
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(50, {2, 20});
  auto changed = tokens.clone();
  changed.narrow(1, 12, 8).add_(1).remainder_(50);
  const auto a = model(tokens), b = model(changed);
  EXPECT_EQ(a.sizes(), (c10::IntArrayRef{2, 20, 50}));
  EXPECT_TRUE(torch::equal(a.narrow(1, 0, 12), b.narrow(1, 0, 12)));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 12, 1), b.narrow(1, 12, 1)));
}

// Float64: the step and the full forward add the same terms in other orders, which float64 makes
// agree to 1e-12.
TEST_P(LanguageModelVariants, DecodingStepsEqualTheFullForward) {
  auto model = small_model(GetParam());
  model->to(at::kDouble);
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(50, {2, 20});
  const auto full = model(tokens);
  auto caches = model->make_caches(2, 20);
  std::vector<at::Tensor> steps{model->forward_step(tokens.narrow(1, 0, 7), caches)};
  for (int64_t i = 7; i < 20; ++i) steps.push_back(model->forward_step(tokens.narrow(1, i, 1), caches));
  EXPECT_TRUE(torch::allclose(torch::cat(steps, 1), full, 0.0, 1e-12));
  EXPECT_EQ(caches.front().lengths(), (std::vector<int64_t>{20, 20}));
}

TEST_P(LanguageModelVariants, GreedyGenerationTakesTheFullForwardsMostLikelyToken) {
  auto model = small_model(GetParam(), 12);
  model->to(at::kDouble);
  const auto prompt = torch::randint(50, {1, 3});
  // 20 tokens past a context of 12: the caches restart once.
  const auto out = generate(*model, prompt, 20, SamplingOptions{0.0, 0}, 0);
  ASSERT_EQ(out.sizes(), (c10::IntArrayRef{1, 23}));
  EXPECT_TRUE(torch::equal(out.narrow(1, 0, 3), prompt));
  torch::NoGradGuard no_grad;
  for (int64_t n = 3; n < 12; ++n) {
    const auto expected = model(out.narrow(1, 0, n)).select(1, n - 1).argmax(1);
    EXPECT_EQ(out[0][n].item<int64_t>(), expected.item<int64_t>()) << "token " << n;
  }
}

INSTANTIATE_TEST_SUITE_P(LanguageModel, LanguageModelVariants, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.label); });

TEST(LanguageModel, ASeedGivesTheSameTextAndAnotherSeedAnother) {
  auto model = small_model(kVariants[2]);
  const auto prompt = torch::randint(50, {2, 4});
  const SamplingOptions sampling{1.0, 0};
  const auto a = generate(*model, prompt, 16, sampling, 5);
  EXPECT_TRUE(torch::equal(generate(*model, prompt, 16, sampling, 5), a));
  EXPECT_FALSE(torch::equal(generate(*model, prompt, 16, sampling, 6), a));
  EXPECT_FALSE(model->is_training()) << "generate restores the model's mode";
  model->train();
  generate(*model, prompt, 2, sampling, 5);
  EXPECT_TRUE(model->is_training());
}

TEST(SampleTokens, TopKDrawsOnlyAmongTheKMostLikely) {
  const auto logits = torch::tensor({{0.0, 3.0, 1.0, 2.9, -1.0}}).expand({4000, 5}).contiguous();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1);
  const auto drawn = sample_tokens(logits, SamplingOptions{1.0, 2}, generator);
  EXPECT_TRUE(((drawn == 1) | (drawn == 3)).all().item<bool>());
  EXPECT_TRUE((drawn == 3).any().item<bool>() && (drawn == 1).any().item<bool>());
  EXPECT_TRUE(torch::equal(sample_tokens(logits, SamplingOptions{0.0, 0}), torch::full({4000}, 1, at::kLong)));
}

TEST(SampleTokens, BadOptionsAreRefusedWithTheRule) {
  const auto logits = torch::zeros({2, 5});
  EXPECT_NE(error_of([&] { sample_tokens(logits, SamplingOptions{-1.0, 0}); })
                .find("temperature must be >= 0 (0: the most likely token), got -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { sample_tokens(logits, SamplingOptions{1.0, -2}); }).find("top_k must be >= 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { sample_tokens(torch::zeros({5}), SamplingOptions{}); }).find("logits must be floating point [B, V]"),
            std::string::npos);
}

TEST(LanguageModel, BadTokensAndPromptsAreRefusedByName) {
  auto model = small_model(kVariants[0]);
  EXPECT_NE(error_of([&] { model(torch::full({1, 3}, 50, at::kLong)); })
                .find("tokens must be token ids in [0, vocab_size = 50), got values in [50, 50]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model(torch::zeros({1, 30}, at::kLong)); }).find("past the context of 24 tokens"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model(torch::zeros({2, 3})); }).find("tokens must be int64 [B, T]"), std::string::npos);
  EXPECT_NE(error_of([&] { generate(*model, torch::zeros({1, 30}, at::kLong), 1, {}, 0); })
                .find("prompts at positions 0 to 29 are past the context of 24 tokens"),
            std::string::npos);
  auto caches = model->make_caches(1, 24);
  EXPECT_NE(error_of([&] { model->forward_step(torch::zeros({2, 1}, at::kLong), caches); }).find("tokens hold 2 samples"),
            std::string::npos);
}

TEST(Registry, LanguageModelsTakeTheirOptionsAndRefuseTheImageOnes) {
  ModelConfig config;
  config.num_classes = 256;
  config.vit.attention = ViTAttention::ConvNN;
  config.convnn.k = 16;
  config.lm.context = 64;
  config.lm.num_kv_heads = 2;
  const auto model = build_model("lm_tiny", config);
  const auto& o = model.get<LanguageModelImpl>()->options;
  EXPECT_EQ(o.context(), 64);
  EXPECT_EQ(o.vocab_size(), 256);
  EXPECT_EQ(o.num_kv_heads(), 2);
  EXPECT_EQ(o.convnn().k(), 16);
  EXPECT_EQ(model.cost().parameters(), model.parameter_count());
  // The MHSA twin has the same size but for ConvNN's depthwise kernels (d x K per block).
  auto twin = config;
  twin.vit.attention = ViTAttention::MHSA;
  twin.convnn = {};
  EXPECT_EQ(model.parameter_count() - build_model("lm_tiny", twin).parameter_count(), 4 * 32 * 16);

  auto images = config;
  images.in_channels = 1;
  EXPECT_NE(error_of([&] { build_model("lm_tiny", images); }).find("in_channels = 1 is not used by lm_tiny"),
            std::string::npos);
  auto patch = config;
  patch.vit.patch_size = 8;
  EXPECT_NE(error_of([&] { build_model("lm_tiny", patch); }).find("patch_size = 8 is not used by lm_tiny"),
            std::string::npos);
  auto heads = config;
  heads.lm.num_kv_heads = 3;
  EXPECT_NE(error_of([&] { build_model("lm_tiny", heads); }).find("num_kv_heads = 3 must divide num_heads = 4"),
            std::string::npos);
  auto vit = ModelConfig{};
  vit.lm.context = 64;
  EXPECT_NE(error_of([&] { build_model("vit_tiny", vit); }).find("context = 64 applies to language models only"),
            std::string::npos);
}

}  // namespace
