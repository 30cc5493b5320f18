// Under CPU autocast the ops take the autocast dtype, so ConvNN layers mix with autocast layers.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/nn/modules/convnn.h"

namespace {

TEST(Autocast, ConvNNLayersRunInBFloat16BetweenAutocastLayers) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1));
  convnn::nn::BranchingConv2d branching(convnn::nn::BranchingConv2dOptions(8, 8, 9));
  convnn::nn::ConvNNAttention attention(convnn::nn::ConvNNAttentionOptions(16, 2, 4));
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  const auto x = torch::randn({2, 3, 6, 6}, torch::requires_grad());
  const auto y = branching(conv(x));
  const auto z = attention(torch::randn({2, 5, 16}).to(torch::kBFloat16));
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(z.scalar_type(), torch::kBFloat16);
  y.to(torch::kFloat).sum().backward();
  EXPECT_EQ(x.grad().scalar_type(), torch::kFloat);
  EXPECT_TRUE(x.grad().isfinite().all().item<bool>());
}

}  // namespace
