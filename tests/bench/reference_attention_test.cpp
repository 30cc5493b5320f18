// The benchmark's reference path (the paper's Algorithm 1 in plain ATen) computes the same
// function as the fused path, on the same weights: forward and gradients. K < N with continuous
// random inputs, so that no top-k tie can make the two select different neighbours.
#include "convnn/bench/reference_attention.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/nn/functional/convnn.h"
#include "convnn/nn/modules/convnn.h"
#include "convnn/ops/knn_ops.h"
#include "support/assert_close.h"

namespace {

using convnn::Similarity;
using convnn::bench::attention_weights;
using convnn::bench::mhsa_attention;
using convnn::bench::reference_attention;
using convnn::bench::reference_conv_nn;
using convnn::testing::AllClose;
namespace nn = convnn::nn;

constexpr double kTolerance = 1e-10;  // float64 throughout

at::Tensor randn(at::IntArrayRef shape, at::Generator& gen) {
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble));
}

// A ConvNNAttention in float64 with every weight (the kernel too, which starts as ones) random.
nn::ConvNNAttention random_module(int64_t channels, int64_t heads, int64_t k, nn::Aggregation aggregation,
                                  Similarity similarity, at::Generator& gen) {
  nn::ConvNNAttention module(nn::ConvNNAttentionOptions(channels, heads, k)
                                 .aggregation(aggregation)
                                 .similarity(similarity));
  module->to(at::kDouble);
  torch::NoGradGuard no_grad;
  for (auto& p : module->parameters()) p.copy_(randn(p.sizes(), gen) / std::sqrt(static_cast<double>(channels)));
  return module;
}

struct Case {
  nn::Aggregation aggregation;
  Similarity similarity;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << nn::to_string(c.aggregation) << " " << to_string(c.similarity);
}

class ReferenceAttention : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceAttention, OpLevelMatchesSelectSoftmaxAggregate) {
  const auto [aggregation, similarity] = GetParam();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const int64_t g = 3, n = 17, d = 6, k = 5;
  const auto q = randn({g, n, d}, gen), keys = randn({g, n, d}, gen), v = randn({g, n, d}, gen);
  const auto kernel = aggregation == nn::Aggregation::Depthwise ? randn({d, k}, gen) : randn({d + 1, d, k}, gen);
  auto [scores, indices] = convnn::ops::knn_select(q, keys, k, convnn::to_string(similarity), c10::nullopt, false);
  const auto weights = nn::functional::rho_weights(scores, nn::Rho::Softmax);
  const auto fused = convnn::ops::knn_aggregate(v, weights, indices, kernel, c10::nullopt);
  const auto reference = reference_conv_nn(q, keys, v, kernel, k, similarity);
  EXPECT_TRUE(AllClose(reference, fused, kTolerance));
}

TEST_P(ReferenceAttention, ModuleLevelMatchesConvNNAttentionForwardAndBackward) {
  const auto [aggregation, similarity] = GetParam();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const int64_t b = 2, n = 13, c = 12, heads = 3, k = 4;
  auto module = random_module(c, heads, k, aggregation, similarity, gen);
  const auto weights = attention_weights(*module);

  const auto x = randn({b, n, c}, gen).requires_grad_(true);
  const auto grad_output = randn({b, n, c}, gen);
  const auto run = [&](const std::function<at::Tensor()>& forward) {
    for (auto& p : module->parameters()) p.mutable_grad() = at::Tensor();
    x.mutable_grad() = at::Tensor();
    const auto y = forward();
    y.backward(grad_output);
    std::vector<at::Tensor> grads{y.detach(), x.grad().clone()};
    for (const auto& p : module->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto fused = run([&] { return module(x); });
  const auto reference = run([&] { return reference_attention(x, weights, heads, k, similarity); });
  ASSERT_EQ(fused.size(), reference.size());
  EXPECT_TRUE(AllClose(reference[0], fused[0], kTolerance)) << "output";
  EXPECT_TRUE(AllClose(reference[1], fused[1], kTolerance)) << "grad input";
  for (size_t i = 2; i < fused.size(); ++i) EXPECT_TRUE(AllClose(reference[i], fused[i], kTolerance)) << "grad parameter " << i - 2;
}

INSTANTIATE_TEST_SUITE_P(Bench, ReferenceAttention,
                         ::testing::Values(Case{nn::Aggregation::Depthwise, Similarity::ScaledDot},
                                           Case{nn::Aggregation::Standard, Similarity::ScaledDot},
                                           Case{nn::Aggregation::Depthwise, Similarity::Dot}));

// Theorem 3.1 ties the baseline to the reference: with K = N and a kernel of ones, ConvNN is
// softmax attention, so the MHSA path uses the same projections and scale as the others.
TEST(ReferenceAttention, MhsaEqualsReferenceAtKEqualsNWithUnitKernel) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t b = 2, n = 9, c = 8, heads = 2;
  auto module = random_module(c, heads, n, nn::Aggregation::Depthwise, Similarity::ScaledDot, gen);
  {
    torch::NoGradGuard no_grad;
    module->kernel.fill_(1.0);
  }
  const auto weights = attention_weights(*module);
  const auto x = randn({b, n, c}, gen);
  EXPECT_TRUE(AllClose(reference_attention(x, weights, heads, n, Similarity::ScaledDot),
                       mhsa_attention(x, weights, heads, Similarity::ScaledDot), kTolerance));
}

TEST(ReferenceAttention, RejectsSimilaritiesOutsideAlgorithmOne) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const auto t = randn({1, 4, 2}, gen);
  EXPECT_THROW(reference_conv_nn(t, t, t, randn({2, 2}, gen), 2, Similarity::Cosine), c10::Error);
}

}  // namespace
