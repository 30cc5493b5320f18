// RandAugment (timm's rand-m9-mstd0.5-inc1): each op's defining property and its level ->
// argument mapping, PIL's arithmetic on small worked examples, timm's draw order, determinism
// and argument errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>

#include "convnn/data/transforms.h"
#include "data/fixtures.h"

namespace {

using namespace convnn::data;
using namespace convnn::testing;

Image gray_image(int64_t h, int64_t w, const std::vector<uint8_t>& levels) {
  Image image(h, w, 3);
  for (int64_t i = 0; i < h * w; ++i) {
    image.pixels[3 * i] = image.pixels[3 * i + 1] = image.pixels[3 * i + 2] = levels[i];
  }
  return image;
}

Image constant(int64_t h, int64_t w, uint8_t v) {
  return gray_image(h, w, std::vector<uint8_t>(h * w, v));
}

Image apply(Image image, const std::string& op, double level, uint64_t key = 0) {
  Rng rng(9, 9, key);
  apply_augment_op(image, op, level, rng);
  return image;
}

// PIL's Image.blend: degenerate + factor * (image - degenerate) in float, clipped, truncated.
uint8_t blended(float degenerate, float value, float factor) {
  const float v = degenerate + factor * (value - degenerate);
  return static_cast<uint8_t>(std::min(std::max(v, 0.0f), 255.0f));
}

// Level 10 of an "Increasing" enhance op is the factor 1.9 or, with the drawn sign, 0.1.
void expect_one_of_the_two_factors(const Image& out, const Image& in, float degenerate_value,
                                   size_t index) {
  const uint8_t strong = blended(degenerate_value, in.pixels[index], 1.9f);
  const uint8_t weak = blended(degenerate_value, in.pixels[index], 0.1f);
  EXPECT_TRUE(out.pixels[index] == strong || out.pixels[index] == weak)
      << "got " << int{out.pixels[index]} << ", expected " << int{strong} << " or " << int{weak};
}

TEST(RandAugment, OpsAreTimmsIncreasingSetInItsOrder) {
  const std::vector<std::string> timm = {"AutoContrast",
                                         "Equalize",
                                         "Invert",
                                         "Rotate",
                                         "PosterizeIncreasing",
                                         "SolarizeIncreasing",
                                         "SolarizeAdd",
                                         "ColorIncreasing",
                                         "ContrastIncreasing",
                                         "BrightnessIncreasing",
                                         "SharpnessIncreasing",
                                         "ShearX",
                                         "ShearY",
                                         "TranslateXRel",
                                         "TranslateYRel"};
  EXPECT_EQ(rand_augment_ops(), timm);
}

TEST(RandAugment, InvertMapsEachLevelToItsComplementAndTwiceIsTheIdentity) {
  const Image image = random_image(5, 6, 1);
  const Image once = apply(image, "Invert", 9);
  for (size_t i = 0; i < image.pixels.size(); ++i) EXPECT_EQ(once.pixels[i], 255 - image.pixels[i]);
  EXPECT_EQ(apply(once, "Invert", 9).pixels, image.pixels);
}

TEST(RandAugment, SolarizeIncreasingIsTheIdentityAtLevelZeroAndInvertsAtLevelTen) {
  const Image image = random_image(5, 6, 2);
  EXPECT_EQ(apply(image, "SolarizeIncreasing", 0).pixels, image.pixels);  // threshold 256
  EXPECT_EQ(apply(image, "SolarizeIncreasing", 10).pixels, apply(image, "Invert", 0).pixels);
  // Level 5: threshold 256 - int(128) = 128.
  const Image half = apply(image, "SolarizeIncreasing", 5);
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    const int v = image.pixels[i];
    EXPECT_EQ(half.pixels[i], v < 128 ? v : 255 - v);
  }
}

TEST(RandAugment, SolarizeAddAddsSaturatingBelowTheMidpointOnly) {
  const Image image = gray_image(1, 5, {0, 100, 127, 128, 250});
  // Level 10: add int(110) = 110 below 128.
  EXPECT_EQ(apply(image, "SolarizeAdd", 10).pixels,
            gray_image(1, 5, {110, 210, 237, 128, 250}).pixels);
  EXPECT_EQ(apply(image, "SolarizeAdd", 0).pixels, image.pixels);
}

TEST(RandAugment, PosterizeIncreasingKeepsFourBitsAtLevelZeroDownToNoneAtTen) {
  const Image image = random_image(4, 4, 3);
  const auto masked = [&](int mask) {
    Image out = image;
    for (auto& v : out.pixels) v = static_cast<uint8_t>(v & mask);
    return out.pixels;
  };
  EXPECT_EQ(apply(image, "PosterizeIncreasing", 0).pixels, masked(0xF0));   // 4 bits
  EXPECT_EQ(apply(image, "PosterizeIncreasing", 5).pixels, masked(0xC0));   // 4 - int(2) = 2
  EXPECT_EQ(apply(image, "PosterizeIncreasing", 10).pixels, masked(0x00));  // 0 bits: black
}

TEST(RandAugment, EnhanceOpsAtLevelZeroAreTheIdentity) {
  const Image image = random_image(6, 7, 4);
  for (const char* op :
       {"ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing"}) {
    EXPECT_EQ(apply(image, op, 0).pixels, image.pixels) << op;  // factor 1
  }
}

TEST(RandAugment, BrightnessBlendsWithBlackAtFactorOnePlusOrMinusZeroPointNine) {
  const Image image = random_image(4, 5, 5);
  std::set<std::vector<uint8_t>> outcomes;
  for (uint64_t key = 0; key < 16; ++key) {
    const Image out = apply(image, "BrightnessIncreasing", 10, key);
    for (size_t i = 0; i < image.pixels.size(); ++i) {
      expect_one_of_the_two_factors(out, image, 0.0f, i);
    }
    outcomes.insert(out.pixels);
  }
  EXPECT_EQ(outcomes.size(), 2u);  // both signs are drawn
}

TEST(RandAugment, ContrastBlendsWithTheRoundedMeanLuma) {
  // Luma 0 and 255: mean 127.5, rounded half up to 128.
  const Image image = gray_image(1, 2, {0, 255});
  const Image out = apply(image, "ContrastIncreasing", 10);
  for (size_t i = 0; i < 6; ++i) expect_one_of_the_two_factors(out, image, 128.0f, i);
}

TEST(RandAugment, ColorBlendsWithPilsLumaAndLeavesGrayAlone) {
  Image red(1, 1, 3);
  red.pixels = {255, 0, 0};
  const Image out = apply(red, "ColorIncreasing", 10);
  // PIL's "L": (255 * 19595 + 0x8000) >> 16 = 76.
  for (size_t i = 0; i < 3; ++i) expect_one_of_the_two_factors(out, red, 76.0f, i);
  const Image gray = random_image(4, 4, 6);
  Image grayish =
      gray_image(4, 4, std::vector<uint8_t>(gray.pixels.begin(), gray.pixels.begin() + 16));
  EXPECT_EQ(apply(grayish, "ColorIncreasing", 10).pixels, grayish.pixels);
}

TEST(RandAugment, SharpnessBlendsWithPilsSmoothFilterAndKeepsTheBorder) {
  // Centre 200 among 100s: SMOOTH gives (8 * 100 + 5 * 200) / 13 = 138.46, rounded to 138.
  Image image = constant(3, 3, 100);
  for (int c = 0; c < 3; ++c) image.at(1, 1)[c] = 200;
  const Image out = apply(image, "SharpnessIncreasing", 10);
  for (int64_t y = 0; y < 3; ++y) {
    for (int64_t x = 0; x < 3; ++x) {
      for (int c = 0; c < 3; ++c) {
        if (y == 1 && x == 1) {
          expect_one_of_the_two_factors(out, image, 138.0f, 3 * (3 * y + x) + c);
        } else {
          EXPECT_EQ(out.at(y, x)[c], 100);
        }
      }
    }
  }
}

TEST(RandAugment, AutoContrastStretchesEachChannelsRangeToTheFullScale) {
  Image image(1, 3, 3);
  image.pixels = {50, 80, 0, 100, 80, 128, 150, 80, 255};  // R in [50, 150], G constant
  const Image out = apply(image, "AutoContrast", 9);
  // R: scale 2.55, offset -127.5, truncated; G: a single level is left alone; B: already full.
  EXPECT_EQ(out.pixels, (std::vector<uint8_t>{0, 80, 0, 127, 80, 128, 255, 80, 255}));
}

TEST(RandAugment, EqualizeMatchesPilsAlgorithmOnWorkedExamples) {
  // 1024 pixels, four levels of 256: step = (1024 - 256) // 255 = 3, and level i maps to
  // (step // 2 + pixels below i) // step: 1 // 3, 257 // 3, 513 // 3, 769 // 3 (clipped).
  std::vector<uint8_t> levels(1024);
  for (size_t i = 0; i < levels.size(); ++i) levels[i] = static_cast<uint8_t>(10 * (1 + i / 256));
  std::vector<uint8_t> expected(1024);
  const uint8_t mapped[] = {0, 85, 171, 255};
  for (size_t i = 0; i < levels.size(); ++i) expected[i] = mapped[i / 256];
  EXPECT_EQ(apply(gray_image(32, 32, levels), "Equalize", 9).pixels,
            gray_image(32, 32, expected).pixels);
  // Fewer pixels than 255 beyond the last level: step 0, the identity.
  const Image small = random_image(8, 8, 7);
  EXPECT_EQ(apply(small, "Equalize", 9).pixels, small.pixels);
}

TEST(RandAugment, EqualizeFlattensASkewedHistogram) {
  std::vector<uint8_t> levels(64 * 64);
  for (size_t i = 0; i < levels.size(); ++i) {
    levels[i] = static_cast<uint8_t>(std::pow(static_cast<double>(i) / levels.size(), 3.0) * 255);
  }
  const Image out = apply(gray_image(64, 64, levels), "Equalize", 9);
  // At every output level, the share of pixels below it follows the level (a level's pixels
  // cannot be split, so only the levels that occur are checked).
  std::array<int64_t, 256> histogram{};
  for (size_t i = 0; i < levels.size(); ++i) ++histogram[out.pixels[3 * i]];
  int64_t below = 0, used = 0;
  for (int v = 0; v < 256; ++v) {
    if (histogram[v] == 0) continue;
    EXPECT_NEAR(static_cast<double>(below) / levels.size(), v / 255.0, 0.01) << v;
    below += histogram[v];
    ++used;
  }
  EXPECT_GT(used, 30);
}

TEST(RandAugment, GeometricOpsAtLevelZeroAreTheIdentity) {
  const Image image = random_image(7, 9, 8);
  for (const char* op : {"Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"}) {
    EXPECT_EQ(apply(image, op, 0).pixels, image.pixels) << op;
  }
}

TEST(RandAugment, RotateByNinetyDegreesPermutesPixelsAboutTheCentre) {
  // Level 30 is 90 degrees: pixel centres land on pixel centres, so the result is exact.
  const int64_t n = 6;
  const Image image = random_image(n, n, 9);
  Image counter(n, n, 3), clockwise(n, n, 3);
  for (int64_t y = 0; y < n; ++y) {
    for (int64_t x = 0; x < n; ++x) {
      std::copy_n(image.at(x, n - 1 - y), 3, counter.at(y, x));
      std::copy_n(image.at(n - 1 - x, y), 3, clockwise.at(y, x));
    }
  }
  std::set<std::vector<uint8_t>> seen;
  for (uint64_t key = 0; key < 8; ++key) {
    const auto out = apply(image, "Rotate", 30, key).pixels;
    EXPECT_TRUE(out == counter.pixels || out == clockwise.pixels);
    seen.insert(out);
  }
  EXPECT_EQ(seen.size(), 2u);
}

TEST(RandAugment, TranslateMovesPixelsByTheExactOffsetAndFillsTheRest) {
  // Level 10 on a width of 20 is 0.45 * 20 = 9 pixels, left or right.
  ASSERT_EQ(0.45 * 20, 9.0);
  const Image image = random_image(3, 20, 10);
  const RandAugmentOptions options;
  std::set<int> shifts;
  for (uint64_t key = 0; key < 8; ++key) {
    const Image out = apply(image, "TranslateXRel", 10, key);
    // The output samples the input at x + shift.
    const int shift =
        out.at(0, 19)[0] == options.fill[0] && out.at(0, 19)[1] == options.fill[1] ? 9 : -9;
    shifts.insert(shift);
    for (int64_t y = 0; y < 3; ++y) {
      for (int64_t x = 0; x < 20; ++x) {
        const int64_t source = x + shift;
        for (int c = 0; c < 3; ++c) {
          const uint8_t expected =
              source >= 0 && source < 20 ? image.at(y, source)[c] : options.fill[c];
          ASSERT_EQ(out.at(y, x)[c], expected) << "shift " << shift << " at " << y << "," << x;
        }
      }
    }
  }
  EXPECT_EQ(shifts.size(), 2u);
}

TEST(RandAugment, ShearXShiftsEachRowInProportionToItsHeight) {
  // Level 10 is a shear of +-0.3: row y samples column x -+ 0.3 (y + 0.5), so the top row moves
  // by 0.15 of a pixel and the bottom row by 2.85, bringing in the fill on one side only.
  const Image image = constant(10, 10, 50);
  const Image out = apply(image, "ShearX", 10);
  EXPECT_EQ(out.at(0, 5)[0], 50);  // the top row barely moves
  const bool left = out.at(9, 0)[0] != 50, right = out.at(9, 9)[0] != 50;
  EXPECT_NE(left, right);  // fill enters on one side
}

TEST(RandAugment, RandAugmentDrawsOpsThenApplyTestMagnitudeAndSignPerOp) {
  const Image image = random_image(12, 14, 11);
  const auto& names = rand_augment_ops();
  const RandAugmentOptions options;  // 2 ops, m 9, std 0.5, p 0.5
  for (uint64_t key = 0; key < 40; ++key) {
    Image got = image;
    Rng rng(3, 1, key);
    rand_augment(got, rng, options);
    Image expected = image;
    Rng replay(3, 1, key);
    const int64_t first = replay.below(15), second = replay.below(15);
    for (const int64_t op : {first, second}) {
      if (replay.uniform() > 0.5) continue;
      const double level = std::clamp(9.0 + 0.5 * replay.normal(), 0.0, 10.0);
      apply_augment_op(expected, names[op], level, replay, options);
    }
    EXPECT_EQ(got.pixels, expected.pixels) << key;
  }
}

TEST(RandAugment, ZeroProbabilityOrZeroOpsIsTheIdentity) {
  const Image image = random_image(8, 8, 12);
  RandAugmentOptions never;
  never.probability = 0.0;
  RandAugmentOptions none;
  none.num_ops = 0;
  for (const auto& options : {never, none}) {
    Image out = image;
    Rng rng(1, 2, 3);
    rand_augment(out, rng, options);
    EXPECT_EQ(out.pixels, image.pixels);
  }
}

TEST(RandAugment, IsDeterministicPerKeyAndDiffersAcrossKeys) {
  const Image image = random_image(16, 16, 13);
  const auto run = [&](uint64_t key) {
    Image out = image;
    Rng rng(2, 2, key);
    RandAugmentOptions always;
    always.probability = 1.0;
    rand_augment(out, rng, always);
    return out.pixels;
  };
  EXPECT_EQ(run(4), run(4));
  std::set<std::vector<uint8_t>> outputs;
  for (uint64_t key = 0; key < 10; ++key) outputs.insert(run(key));
  EXPECT_GE(outputs.size(), 9u);
}

TEST(RandAugment, BadArgumentsAreErrorsNamingTheArgumentAndTheRule) {
  Image image = random_image(4, 4, 14);
  Rng rng(0, 0, 0);
  expect_error([&] { apply_augment_op(image, "Cutout", 5, rng); }, "unknown op 'Cutout'",
               "expected one of AutoContrast, Equalize");
  expect_error([&] { apply_augment_op(image, "Rotate", -1, rng); }, "apply_augment_op: magnitude",
               "must be finite and >= 0, got -1");
  RandAugmentOptions bad;
  bad.probability = 2.0;
  expect_error([&] { rand_augment(image, rng, bad); }, "rand_augment: probability",
               "must be in [0, 1], got 2");
  bad = {};
  bad.num_ops = -1;
  expect_error([&] { rand_augment(image, rng, bad); }, "rand_augment: num_ops", "got -1");
  Image gray = random_image(4, 4, 15, 1);
  expect_error([&] { rand_augment(gray, rng); }, "rand_augment: image", "RGB image (3 channels");
}

}  // namespace
