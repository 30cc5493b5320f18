// MixUp / CutMix in timm's batch mode: soft targets (smoothing, rows summing to one), the CutMix
// box and its corrected lambda, mixing with the reversed batch, the switch between the two, the
// Beta draw, determinism and argument errors.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/data/transforms.h"
#include "data/fixtures.h"

namespace {

using namespace convnn::data;
using namespace convnn::testing;

constexpr int64_t kClasses = 10;

struct Batch {
  at::Tensor images, labels;
};

Batch make_batch(int64_t b, int64_t h = 8, int64_t w = 12, uint64_t seed = 1) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {at::randn({b, 3, h, w}, generator), at::randint(0, kClasses, {b}, generator)};
}

MixupOptions only_cutmix() {
  MixupOptions o;
  o.switch_probability = 1.0;
  return o;
}

MixupOptions only_mixup() {
  MixupOptions o;
  o.switch_probability = 0.0;
  return o;
}

at::Tensor smooth_one_hot(const at::Tensor& labels, double smoothing) {
  const double off = smoothing / kClasses;
  return at::one_hot(labels, kClasses).to(at::kFloat) * (1.0 - smoothing) + off;
}

TEST(Mixup, TargetRowsSumToOneForMixupAndCutmix) {
  for (const auto& options : {only_mixup(), only_cutmix(), MixupOptions{}}) {
    for (uint64_t key = 0; key < 10; ++key) {
      auto batch = make_batch(6);
      at::Tensor targets;
      Rng rng(1, 1, key);
      mixup_cutmix(batch.images, batch.labels, kClasses, rng, options, targets);
      ASSERT_EQ(targets.sizes(), (at::IntArrayRef{6, kClasses}));
      EXPECT_TRUE(at::allclose(targets.sum(1), at::ones({6}), 1e-5, 1e-6));
      EXPECT_GE(targets.min().item<float>(), 0.0f);
    }
  }
}

TEST(Mixup, WithoutMixingTargetsAreSmoothedOneHotVectors) {
  auto batch = make_batch(4);
  const auto before = batch.images.clone();
  MixupOptions never;
  never.probability = 0.0;
  at::Tensor targets;
  Rng rng(2, 2, 2);
  const MixResult r = mixup_cutmix(batch.images, batch.labels, kClasses, rng, never, targets);
  EXPECT_EQ(r.lambda, 1.0);
  EXPECT_FALSE(r.cutmix);
  EXPECT_TRUE(at::equal(batch.images, before));
  // off = 0.1 / 10 = 0.01, on = 1 - 0.1 + 0.01 = 0.91.
  EXPECT_TRUE(at::allclose(targets, smooth_one_hot(batch.labels, 0.1)));
  const auto y0 = batch.labels[0].item<int64_t>();
  EXPECT_FLOAT_EQ(targets[0][y0].item<float>(), 0.91f);
  EXPECT_FLOAT_EQ(targets[0][(y0 + 1) % kClasses].item<float>(), 0.01f);
}

TEST(Mixup, MixupBlendsEachImageWithItsPartnerInTheReversedBatch) {
  auto batch = make_batch(5);
  const auto before = batch.images.clone();
  at::Tensor targets;
  Rng rng(3, 3, 3);
  const MixResult r =
      mixup_cutmix(batch.images, batch.labels, kClasses, rng, only_mixup(), targets);
  ASSERT_FALSE(r.cutmix);
  ASSERT_GT(r.lambda, 0.0);
  ASSERT_LT(r.lambda, 1.0);
  const auto expected = before * r.lambda + before.flip(0) * (1.0 - r.lambda);
  EXPECT_TRUE(at::allclose(batch.images, expected, 1e-5, 1e-6));
  const auto labels_flipped = batch.labels.flip(0);
  const auto expected_targets = smooth_one_hot(batch.labels, 0.1) * r.lambda +
                                smooth_one_hot(labels_flipped, 0.1) * (1.0 - r.lambda);
  EXPECT_TRUE(at::allclose(targets, expected_targets, 1e-5, 1e-6));
}

TEST(Mixup, CutmixPastesThePartnersBoxAndCorrectsLambdaToItsArea) {
  int boxes_seen = 0;
  for (uint64_t key = 0; key < 30; ++key) {
    auto batch = make_batch(4, 8, 12, key);
    const auto before = batch.images.clone();
    at::Tensor targets;
    Rng rng(4, 4, key);
    const MixResult r =
        mixup_cutmix(batch.images, batch.labels, kClasses, rng, only_cutmix(), targets);
    ASSERT_TRUE(r.cutmix);
    const CropBox& b = r.box;
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, 8);
    ASSERT_LE(b.left + b.width, 12);
    EXPECT_DOUBLE_EQ(r.lambda, 1.0 - static_cast<double>(b.height * b.width) / (8 * 12));
    if (b.height * b.width == 0) {
      EXPECT_TRUE(at::equal(batch.images, before));
      continue;
    }
    ++boxes_seen;
    using torch::indexing::Slice;
    const auto rows = Slice(b.top, b.top + b.height), cols = Slice(b.left, b.left + b.width);
    // Inside: the reversed batch's pixels; outside: untouched.
    EXPECT_TRUE(at::equal(batch.images.index({Slice(), Slice(), rows, cols}),
                          before.flip(0).index({Slice(), Slice(), rows, cols})));
    auto outside = batch.images.clone(), outside_before = before.clone();
    outside.index_put_({Slice(), Slice(), rows, cols}, 0.0);
    outside_before.index_put_({Slice(), Slice(), rows, cols}, 0.0);
    EXPECT_TRUE(at::equal(outside, outside_before));
    const auto expected_targets = smooth_one_hot(batch.labels, 0.1) * r.lambda +
                                  smooth_one_hot(batch.labels.flip(0), 0.1) * (1.0 - r.lambda);
    EXPECT_TRUE(at::allclose(targets, expected_targets, 1e-5, 1e-6));
  }
  EXPECT_GT(boxes_seen, 20);
}

TEST(Mixup, SwitchProbabilityAndZeroAlphasChooseTheMethod) {
  int cutmix = 0;
  for (uint64_t key = 0; key < 400; ++key) {
    auto batch = make_batch(2, 4, 4);
    at::Tensor targets;
    Rng rng(5, 5, key);
    cutmix +=
        mixup_cutmix(batch.images, batch.labels, kClasses, rng, MixupOptions{}, targets).cutmix;
  }
  EXPECT_NEAR(cutmix / 400.0, 0.5, 0.08);
  MixupOptions mixup_off, cutmix_off;
  mixup_off.mixup_alpha = 0.0;
  cutmix_off.cutmix_alpha = 0.0;
  for (uint64_t key = 0; key < 20; ++key) {
    auto batch = make_batch(2, 4, 4);
    at::Tensor targets;
    Rng a(6, 6, key), b(6, 6, key);
    EXPECT_TRUE(mixup_cutmix(batch.images, batch.labels, kClasses, a, mixup_off, targets).cutmix);
    EXPECT_FALSE(mixup_cutmix(batch.images, batch.labels, kClasses, b, cutmix_off, targets).cutmix);
  }
}

TEST(Mixup, LambdaFollowsTheSymmetricBetaDraw) {
  // Beta(0.8, 0.8): mean 1/2, variance 1 / (4 (2 alpha + 1)) = 0.0962.
  double sum = 0, squares = 0;
  const int n = 2000;
  for (int key = 0; key < n; ++key) {
    auto batch = make_batch(2, 2, 2);
    at::Tensor targets;
    Rng rng(7, 7, key);
    const double lambda =
        mixup_cutmix(batch.images, batch.labels, kClasses, rng, only_mixup(), targets).lambda;
    sum += lambda;
    squares += lambda * lambda;
  }
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.5, 0.03);
  EXPECT_NEAR(squares / n - mean * mean, 1.0 / (4.0 * 2.6), 0.01);
}

TEST(Mixup, IsDeterministicPerKey) {
  const auto run = [](uint64_t key) {
    auto batch = make_batch(4);
    at::Tensor targets;
    Rng rng(8, 8, key);
    mixup_cutmix(batch.images, batch.labels, kClasses, rng, MixupOptions{}, targets);
    return std::make_pair(batch.images, targets);
  };
  const auto [a_images, a_targets] = run(3);
  const auto [b_images, b_targets] = run(3);
  EXPECT_TRUE(at::equal(a_images, b_images));
  EXPECT_TRUE(at::equal(a_targets, b_targets));
  EXPECT_FALSE(at::equal(a_images, run(4).first));
}

TEST(Mixup, BadArgumentsAreErrorsNamingTheArgumentAndTheRule) {
  auto batch = make_batch(4);
  at::Tensor targets;
  Rng rng(0, 0, 0);
  const auto call = [&](at::Tensor images, at::Tensor labels, int64_t classes,
                        const MixupOptions& options) {
    mixup_cutmix(images, labels, classes, rng, options, targets);
  };
  expect_error([&] { call(batch.images, batch.labels, 5, {}); }, "mixup_cutmix: labels",
               "must be in [0, num_classes = 5)");
  expect_error([&] { call(batch.images.to(at::kDouble), batch.labels, kClasses, {}); },
               "mixup_cutmix: images", "contiguous CPU float32 [B, C, H, W]");
  expect_error([&] { call(batch.images, batch.labels.narrow(0, 0, 3), kClasses, {}); },
               "mixup_cutmix: labels", "B = 4");
  expect_error([&] { call(batch.images, batch.labels, 0, {}); }, "mixup_cutmix: num_classes",
               "must be positive, got 0");
  MixupOptions off;
  off.mixup_alpha = off.cutmix_alpha = 0.0;
  expect_error([&] { call(batch.images, batch.labels, kClasses, off); },
               "mixup_cutmix: mixup_alpha or cutmix_alpha", "must be > 0");
  MixupOptions bad;
  bad.switch_probability = -0.5;
  expect_error([&] { call(batch.images, batch.labels, kClasses, bad); },
               "mixup_cutmix: switch_probability", "must be in [0, 1], got -0.5");
  bad = {};
  bad.label_smoothing = 1.5;
  expect_error([&] { call(batch.images, batch.labels, kClasses, bad); },
               "mixup_cutmix: label_smoothing", "must be in [0, 1], got 1.5");
}

}  // namespace
