// The learning-rate schedule at its key steps, and the losses against ATen's own.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "convnn/train/loss.h"
#include "convnn/train/schedule.h"

namespace convnn::train {
namespace {

TEST(LrSchedule, WarmupIsLinearFromWarmupLrToLr) {
  const LrSchedule s(Schedule::Cosine, 1e-3, 1e-7, 5e-6, 100, 1000);
  EXPECT_DOUBLE_EQ(s.at(0), 1e-7);
  EXPECT_DOUBLE_EQ(s.at(50), 1e-7 + (1e-3 - 1e-7) * 0.5);
  EXPECT_DOUBLE_EQ(s.at(100), 1e-3);
}

TEST(LrSchedule, CosineReachesMinLrAtTheLastStep) {
  const LrSchedule s(Schedule::Cosine, 1e-3, 1e-7, 5e-6, 100, 1001);
  EXPECT_DOUBLE_EQ(s.at(100), 1e-3);
  EXPECT_NEAR(s.at(550), 5e-6 + 0.5 * (1e-3 - 5e-6), 1e-15);  // halfway: the mean of lr and min_lr
  EXPECT_DOUBLE_EQ(s.at(1000), 5e-6);
  EXPECT_DOUBLE_EQ(s.at(5000), 5e-6);
  for (int64_t step = 101; step < 1001; ++step) EXPECT_LE(s.at(step), s.at(step - 1));
}

TEST(LrSchedule, ConstantKeepsLrAfterTheWarmup) {
  const LrSchedule s(Schedule::Constant, 0.1, 0.0, 0.0, 10, 100);
  EXPECT_DOUBLE_EQ(s.at(5), 0.05);
  EXPECT_DOUBLE_EQ(s.at(99), 0.1);
}

TEST(LrSchedule, FromConfigCountsStepsPerIteration) {
  TrainConfig c;
  c.optimization.epochs = 10;
  c.optimization.warmup_epochs = 1.5;
  const auto s = LrSchedule::from_config(c.optimization, 40);
  EXPECT_EQ(s.total_steps(), 400);
  EXPECT_EQ(s.warmup_steps(), 60);
}

TEST(Loss, SmoothTargetsSumToOne) {
  const auto labels = torch::tensor({0, 3, 9}, torch::kLong);
  const auto t = smooth_targets(labels, 10, 0.1);
  EXPECT_TRUE(torch::allclose(t.sum(1), torch::ones({3})));
  EXPECT_FLOAT_EQ(t[1][3].item<float>(), 0.9f + 0.01f);
  EXPECT_FLOAT_EQ(t[1][0].item<float>(), 0.01f);
}

TEST(Loss, SoftTargetCrossEntropyEqualsLabelSmoothedCrossEntropy) {
  torch::manual_seed(0);
  const auto logits = torch::randn({6, 10}, torch::kDouble);
  const auto labels = torch::randint(10, {6}, torch::kLong);
  const auto ours = soft_target_cross_entropy(logits, smooth_targets(labels, 10, 0.1, torch::kDouble));
  const auto aten = torch::nn::functional::cross_entropy(
      logits, labels, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(0.1));
  EXPECT_NEAR(ours.item<double>(), aten.item<double>(), 1e-6);  // ours is computed in float32
}

TEST(Loss, CorrectTopK) {
  const auto logits = torch::tensor({{0.1, 0.9, 0.0}, {0.8, 0.1, 0.5}});
  const auto labels = torch::tensor({1, 2}, torch::kLong);
  EXPECT_EQ(correct_top_k(logits, labels, 1), 1);
  EXPECT_EQ(correct_top_k(logits, labels, 2), 2);
  EXPECT_EQ(correct_top_k(logits, labels, 5), 2);  // k above the classes counts every row
}

}  // namespace
}  // namespace convnn::train
