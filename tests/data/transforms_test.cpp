// Geometry, resampling, colour jitter, normalisation and random erasing: each transform's
// defining property, PIL's resampling against an independent float64 formula and ATen's
// antialiased kernels, torchvision's crop-box algorithm, determinism and argument errors.
#include "convnn/data/transforms.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>

#include "data/fixtures.h"

namespace {

using namespace convnn::data;
using namespace convnn::testing;

constexpr std::array<float, 3> kMean = {0.485f, 0.456f, 0.406f};
constexpr std::array<float, 3> kStd = {0.229f, 0.224f, 0.225f};

Image constant_image(int64_t h, int64_t w, std::array<uint8_t, 3> rgb) {
  Image image(h, w, 3);
  for (int64_t i = 0; i < h * w; ++i) std::copy(rgb.begin(), rgb.end(), &image.pixels[3 * i]);
  return image;
}

// A smooth image (values well inside [0, 255]) so that resampling filters do not overshoot.
Image smooth_image(int64_t h, int64_t w) {
  Image image(h, w, 3);
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      for (int64_t c = 0; c < 3; ++c) {
        image.at(y, x)[c] = static_cast<uint8_t>(128.0 + 70.0 * std::sin(0.21 * x + 0.4 * c) *
                                                             std::cos(0.17 * y - 0.3 * c));
      }
    }
  }
  return image;
}

int max_abs_difference(const Image& a, const Image& b) {
  EXPECT_EQ(a.height, b.height);
  EXPECT_EQ(a.width, b.width);
  int worst = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    worst = std::max(worst, std::abs(int{a.pixels[i]} - int{b.pixels[i]}));
  }
  return worst;
}

TEST(Transforms, HorizontalFlipIsAnInvolutionThatMirrorsColumns) {
  const Image image = random_image(5, 7, 1);
  Image flipped = image;
  horizontal_flip(flipped);
  for (int64_t y = 0; y < 5; ++y) {
    for (int64_t x = 0; x < 7; ++x) {
      for (int c = 0; c < 3; ++c) EXPECT_EQ(flipped.at(y, x)[c], image.at(y, 6 - x)[c]);
    }
  }
  horizontal_flip(flipped);
  EXPECT_EQ(flipped.pixels, image.pixels);
}

TEST(Transforms, CropCopiesExactlyTheWindow) {
  const Image image = random_image(6, 8, 2);
  const Image window = crop(image, 1, 2, 3, 4);
  ASSERT_EQ(window.height, 3);
  ASSERT_EQ(window.width, 4);
  for (int64_t y = 0; y < 3; ++y) {
    for (int64_t x = 0; x < 4; ++x) {
      for (int c = 0; c < 3; ++c) EXPECT_EQ(window.at(y, x)[c], image.at(y + 1, x + 2)[c]);
    }
  }
}

TEST(Transforms, CenterCropRoundsTheOffsetLikeTorchvision) {
  // torchvision: top = round((10 - 5) / 2) = round(2.5) = 2 (half to even), left = round(1.5) = 2.
  const Image image = random_image(10, 7, 3);
  EXPECT_EQ(center_crop(image, 5, 4).pixels, crop(image, 2, 2, 5, 4).pixels);
}

TEST(Transforms, CenterCropZeroPadsAroundASmallerImage) {
  const Image image = random_image(2, 3, 4);
  const Image out = center_crop(image, 5, 4);  // pads (5-2)//2 = 1 row above, 0 columns left
  for (int64_t y = 0; y < 5; ++y) {
    for (int64_t x = 0; x < 4; ++x) {
      const bool inside = y >= 1 && y < 3 && x < 3;
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(out.at(y, x)[c], inside ? image.at(y - 1, x)[c] : 0) << y << "," << x;
      }
    }
  }
}

TEST(Transforms, CenterCropPadsOneSideAndCropsTheOther) {
  // Height 4 -> 5: (5 - 4) // 2 = 0 rows above, one below; width 9 -> 4: from round(2.5) = 2.
  const Image image = random_image(4, 9, 15);
  const Image out = center_crop(image, 5, 4);
  for (int64_t y = 0; y < 5; ++y) {
    for (int64_t x = 0; x < 4; ++x) {
      for (int c = 0; c < 3; ++c) EXPECT_EQ(out.at(y, x)[c], y < 4 ? image.at(y, x + 2)[c] : 0);
    }
  }
}

TEST(Transforms, ResizeOfAConstantImageStaysConstant) {
  const Image image = constant_image(13, 17, {7, 128, 250});
  for (const auto interpolation :
       {Interpolation::Nearest, Interpolation::Bilinear, Interpolation::Bicubic}) {
    for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{{5, 4}, {31, 40}, {13, 3}}) {
      const Image out = resize(image, h, w, interpolation);
      EXPECT_EQ(out.pixels, constant_image(h, w, {7, 128, 250}).pixels)
          << static_cast<int>(interpolation) << " " << h << "x" << w;
    }
  }
}

TEST(Transforms, ResizeToTheSameSizeIsTheIdentity) {
  const Image image = random_image(9, 11, 5);
  for (const auto interpolation :
       {Interpolation::Nearest, Interpolation::Bilinear, Interpolation::Bicubic}) {
    EXPECT_EQ(resize(image, 9, 11, interpolation).pixels, image.pixels);
  }
}

TEST(Transforms, NearestSamplesTheSourcePixelUnderEachOutputCentre) {
  const Image image = random_image(4, 6, 6);
  const Image out = resize(image, 2, 4, Interpolation::Nearest);
  for (int64_t y = 0; y < 2; ++y) {
    for (int64_t x = 0; x < 4; ++x) {
      const auto sy = static_cast<int64_t>((y + 0.5) * 4 / 2);
      const auto sx = static_cast<int64_t>((x + 0.5) * 6 / 4);
      for (int c = 0; c < 3; ++c) EXPECT_EQ(out.at(y, x)[c], image.at(sy, sx)[c]);
    }
  }
}

// PIL's resampling written independently in float64: each output is the filter-weighted mean of
// every input sample (weights renormalised over the image), the support widened by the
// downscale factor; the first pass is rounded to 8 bits before the second. Pillow 13 runs the
// vertical pass first when the height loses more than twice as many pixels as the width.
double cubic(double x) {
  x = std::fabs(x);
  return x < 1   ? 1.5 * x * x * x - 2.5 * x * x + 1
         : x < 2 ? -0.5 * (x * x * x - 5 * x * x + 8 * x - 4)
                 : 0;
}
double linear(double x) { return std::max(0.0, 1.0 - std::fabs(x)); }

std::vector<double> resample_line(const std::vector<double>& in, int64_t out_size, bool bicubic) {
  const auto n = static_cast<int64_t>(in.size());
  if (n == out_size) return in;
  const double scale = static_cast<double>(n) / out_size, widen = std::max(1.0, scale);
  std::vector<double> out(out_size);
  for (int64_t i = 0; i < out_size; ++i) {
    double sum = 0, weights = 0;
    for (int64_t x = 0; x < n; ++x) {
      const double t = (x + 0.5 - (i + 0.5) * scale) / widen;
      const double w = bicubic ? cubic(t) : linear(t);
      sum += w * in[x];
      weights += w;
    }
    out[i] = std::clamp(std::floor(sum / weights + 0.5), 0.0, 255.0);
  }
  return out;
}

// Resamples every row (horizontal) or every column of a float HWC plane set.
using Planes = std::vector<std::vector<std::vector<double>>>;  // [c][y][x]
Planes resample_axis(const Planes& in, int64_t out_size, bool horizontal, bool bicubic) {
  Planes out(in.size());
  const auto h = static_cast<int64_t>(in[0].size()), w = static_cast<int64_t>(in[0][0].size());
  for (size_t c = 0; c < in.size(); ++c) {
    if (horizontal) {
      for (int64_t y = 0; y < h; ++y) out[c].push_back(resample_line(in[c][y], out_size, bicubic));
      continue;
    }
    out[c].assign(out_size, std::vector<double>(w));
    for (int64_t x = 0; x < w; ++x) {
      std::vector<double> column(h);
      for (int64_t y = 0; y < h; ++y) column[y] = in[c][y][x];
      const auto r = resample_line(column, out_size, bicubic);
      for (int64_t y = 0; y < out_size; ++y) out[c][y][x] = r[y];
    }
  }
  return out;
}

Image reference_resize(const Image& image, int64_t out_h, int64_t out_w, bool bicubic) {
  const int64_t h = image.height, w = image.width;
  Planes planes(3, std::vector<std::vector<double>>(h, std::vector<double>(w)));
  for (int c = 0; c < 3; ++c) {
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) planes[c][y][x] = image.at(y, x)[c];
    }
  }
  const bool vertical_first = h - out_h > 0 && h - out_h > 2 * (w - out_w);
  if (vertical_first) {
    planes = resample_axis(resample_axis(planes, out_h, false, bicubic), out_w, true, bicubic);
  } else {
    planes = resample_axis(resample_axis(planes, out_w, true, bicubic), out_h, false, bicubic);
  }
  Image out(out_h, out_w, 3);
  for (int c = 0; c < 3; ++c) {
    for (int64_t y = 0; y < out_h; ++y) {
      for (int64_t x = 0; x < out_w; ++x) out.at(y, x)[c] = static_cast<uint8_t>(planes[c][y][x]);
    }
  }
  return out;
}

TEST(Transforms, BicubicAndBilinearMatchAFloat64ReferenceOfPilsAlgorithm) {
  const Image image = random_image(23, 29, 7);
  for (const bool bicubic : {true, false}) {
    const auto interpolation = bicubic ? Interpolation::Bicubic : Interpolation::Bilinear;
    for (const auto& [h, w] : std::vector<std::pair<int64_t, int64_t>>{
             {7, 9}, {11, 29}, {40, 33}, {5, 61}, {23, 3}, {4, 20}}) {
      const Image got = resize(image, h, w, interpolation);
      EXPECT_LE(max_abs_difference(got, reference_resize(image, h, w, bicubic)), 1)
          << (bicubic ? "bicubic " : "bilinear ") << h << "x" << w;
    }
  }
}

TEST(Transforms, AntialiasedResizeMatchesATensAntialiasedKernels) {
  // ATen's _upsample_*2d_aa follow PIL (a = -0.5, widened support) in float; on a smooth image
  // the 8-bit rounding of PIL's intermediate pass is the only difference.
  const Image image = smooth_image(40, 52);
  const auto input = image_tensor(image).permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat);
  for (const auto& [h, w] :
       std::vector<std::pair<int64_t, int64_t>>{{17, 23}, {40, 19}, {64, 80}}) {
    const auto cubic_ref = at::_upsample_bicubic2d_aa(input, {h, w}, false);
    const auto linear_ref = at::_upsample_bilinear2d_aa(input, {h, w}, false);
    const auto as_hwc = [](const at::Tensor& t) {
      return t.squeeze(0).permute({1, 2, 0}).round().clamp(0, 255);
    };
    const auto got_cubic = image_tensor(resize(image, h, w, Interpolation::Bicubic));
    const auto got_linear = image_tensor(resize(image, h, w, Interpolation::Bilinear));
    EXPECT_LE((got_cubic.to(torch::kFloat) - as_hwc(cubic_ref)).abs().max().item<float>(), 1.0f)
        << h << "x" << w;
    EXPECT_LE((got_linear.to(torch::kFloat) - as_hwc(linear_ref)).abs().max().item<float>(), 1.0f)
        << h << "x" << w;
  }
}

TEST(Transforms, ResizeShorterKeepsTheAspectRatioTruncatingLikeTorchvision) {
  const Image landscape = random_image(375, 500, 8);
  const Image out = resize_shorter(landscape, 256, Interpolation::Bicubic);
  EXPECT_EQ(out.height, 256);
  EXPECT_EQ(out.width, 341);  // int(256 * 500 / 375) = int(341.33)
  const Image portrait = resize_shorter(random_image(30, 20, 9), 7, Interpolation::Bilinear);
  EXPECT_EQ(portrait.width, 7);
  EXPECT_EQ(portrait.height, 10);  // int(7 * 30 / 20) = int(10.5)
}

TEST(Transforms, RandomResizedCropBoxStaysInsideWithAreaAndRatioInBounds) {
  const int64_t h = 300, w = 400;
  const std::array<double, 2> scale = {0.08, 1.0}, ratio = {3.0 / 4.0, 4.0 / 3.0};
  std::set<int64_t> tops, lefts;
  double min_ratio = 10, max_ratio = 0, min_area = 10, max_area = 0;
  for (uint64_t i = 0; i < 2000; ++i) {
    Rng rng(1, 2, i);
    const CropBox b = random_resized_crop_box(h, w, rng, scale, ratio);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_GT(b.height, 0);
    ASSERT_GT(b.width, 0);
    ASSERT_LE(b.top + b.height, h);
    ASSERT_LE(b.left + b.width, w);
    // w and h are rounded, so the bounds hold up to half a pixel per side.
    EXPECT_GE((b.width + 0.5) / (b.height - 0.5), ratio[0]);
    EXPECT_LE((b.width - 0.5) / (b.height + 0.5), ratio[1]);
    EXPECT_GE((b.width + 0.5) * (b.height + 0.5), scale[0] * h * w);
    EXPECT_LE((b.width - 0.5) * (b.height - 0.5), scale[1] * h * w);
    tops.insert(b.top);
    lefts.insert(b.left);
    const double r = static_cast<double>(b.width) / b.height;
    const double a = static_cast<double>(b.width * b.height) / (h * w);
    min_ratio = std::min(min_ratio, r), max_ratio = std::max(max_ratio, r);
    min_area = std::min(min_area, a), max_area = std::max(max_area, a);
  }
  // The draws cover the ranges.
  EXPECT_LT(min_ratio, 0.77);
  EXPECT_GT(max_ratio, 1.3);
  EXPECT_LT(min_area, 0.1);
  EXPECT_GT(max_area, 0.9);
  EXPECT_GT(tops.size(), 100u);
  EXPECT_GT(lefts.size(), 100u);
}

TEST(Transforms, RandomResizedCropFallsBackToTheCentralCropWithTheRatioClamped) {
  // A full-area crop with a ratio the square image cannot hold never fits: after ten tries the
  // box is the central crop with the nearest allowed ratio.
  Rng rng(1, 2, 3);
  const CropBox wide = random_resized_crop_box(100, 100, rng, {1.0, 1.0}, {2.0, 3.0});
  EXPECT_EQ(wide.height, 50);  // round(100 / 2)
  EXPECT_EQ(wide.width, 100);
  EXPECT_EQ(wide.top, 25);
  EXPECT_EQ(wide.left, 0);
  const CropBox tall = random_resized_crop_box(100, 100, rng, {1.0, 1.0}, {0.2, 0.4});
  EXPECT_EQ(tall.height, 100);
  EXPECT_EQ(tall.width, 40);  // round(100 * 0.4)
  EXPECT_EQ(tall.top, 0);
  EXPECT_EQ(tall.left, 30);
}

TEST(Transforms, RandomResizedCropResamplesOnlyTheDrawnBox) {
  const Image image = random_image(37, 45, 10);
  for (uint64_t key = 0; key < 5; ++key) {
    Rng a(4, 5, key), b(4, 5, key);
    const CropBox box = random_resized_crop_box(37, 45, a, {0.08, 1.0}, {0.75, 4.0 / 3.0});
    const Image expected = resize(crop(image, box.top, box.left, box.height, box.width), 16, 16,
                                  Interpolation::Bicubic);
    EXPECT_EQ(random_resized_crop(image, 16, b).pixels, expected.pixels) << key;
  }
}

TEST(Transforms, RandomTransformsAreDeterministicPerKeyAndDifferAcrossKeys) {
  const Image image = random_image(40, 50, 11);
  const auto run = [&](uint64_t key) {
    Rng rng(7, 0, key);
    Image out = random_resized_crop(image, 24, rng);
    color_jitter(out, rng, 0.4, 0.4, 0.4);
    std::vector<float> chw(3 * 24 * 24);
    normalize_into(out, kMean, kStd, chw.data());
    RandomErasingOptions always;
    always.probability = 1.0;
    random_erasing(chw.data(), 3, 24, 24, rng, always);
    return chw;
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_NE(run(1), run(2));
}

TEST(Transforms, ColorJitterWithZeroStrengthIsTheIdentity) {
  Image image = random_image(8, 9, 12);
  const Image before = image;
  Rng rng(1, 1, 1);
  color_jitter(image, rng, 0.0, 0.0, 0.0);
  EXPECT_EQ(image.pixels, before.pixels);
}

TEST(Transforms, ColorJitterBrightnessScalesWithinTheFactorRange) {
  for (uint64_t key = 0; key < 50; ++key) {
    Image image = constant_image(3, 3, {100, 150, 200});
    Rng rng(2, 2, key);
    color_jitter(image, rng, 0.4, 0.0, 0.0);
    // brightness blends with black: every channel is scaled by the same factor in [0.6, 1.4].
    const double f = image.pixels[0] / 100.0;
    EXPECT_GE(f, 0.6 - 0.01);
    EXPECT_LE(f, 1.4 + 0.01);
    EXPECT_NEAR(image.pixels[1], std::min(255.0, 150.0 * f), 3.0);
    EXPECT_NEAR(image.pixels[2], std::min(255.0, 200.0 * f), 4.0);
  }
}

TEST(Transforms, ColorJitterSaturationLeavesGrayPixelsAlone) {
  Rng rng(3, 3, 3);
  Image gray = constant_image(4, 4, {90, 90, 90});
  color_jitter(gray, rng, 0.0, 0.0, 0.9);
  EXPECT_EQ(gray.pixels, constant_image(4, 4, {90, 90, 90}).pixels);
}

TEST(Transforms, NormalizeIntoWritesChannelPlanesOfScaledValues) {
  Image image(1, 2, 3);
  image.pixels = {0, 128, 255, 10, 20, 30};
  std::vector<float> out(6);
  normalize_into(image, kMean, kStd, out.data());
  const std::vector<uint8_t> hwc = image.pixels;
  for (int c = 0; c < 3; ++c) {
    for (int x = 0; x < 2; ++x) {
      const float expected = (hwc[3 * x + c] / 255.0f - kMean[c]) / kStd[c];
      EXPECT_FLOAT_EQ(out[c * 2 + x], expected);
    }
  }
  // The range every value lies in.
  for (int c = 0; c < 3; ++c) {
    EXPECT_GE(out[c * 2], -kMean[c] / kStd[c] - 1e-6f);
    EXPECT_LE(out[c * 2], (1 - kMean[c]) / kStd[c] + 1e-6f);
  }
}

TEST(Transforms, RandomErasingFillsOnlyItsBoxWithStandardNoise) {
  const int64_t c = 3, h = 40, w = 50;
  RandomErasingOptions always;
  always.probability = 1.0;
  int erased = 0;
  std::vector<float> noise;
  for (uint64_t key = 0; key < 40; ++key) {
    std::vector<float> image(c * h * w, 7.0f);
    Rng rng(5, 5, key);
    const auto boxes = random_erasing(image.data(), c, h, w, rng, always);
    ASSERT_LE(boxes.size(), 1u);
    if (boxes.empty()) continue;
    ++erased;
    const CropBox& b = boxes[0];
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LT(b.height, h);
    ASSERT_LT(b.width, w);
    ASSERT_LE(b.top + b.height, h);
    ASSERT_LE(b.left + b.width, w);
    const double area = static_cast<double>(b.height * b.width) / (h * w);
    EXPECT_GE(area, 0.02 * 0.5);  // rounding of small sides
    EXPECT_LE(area, 1.0 / 3.0 * 1.5);
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t y = 0; y < h; ++y) {
        for (int64_t x = 0; x < w; ++x) {
          const bool inside =
              y >= b.top && y < b.top + b.height && x >= b.left && x < b.left + b.width;
          const float v = image[(k * h + y) * w + x];
          if (inside) {
            noise.push_back(v);
          } else {
            ASSERT_EQ(v, 7.0f) << "outside the box at " << k << "," << y << "," << x;
          }
        }
      }
    }
  }
  EXPECT_GT(erased, 35);
  double mean = 0, var = 0;
  for (const float v : noise) mean += v;
  mean /= noise.size();
  for (const float v : noise) var += (v - mean) * (v - mean);
  var /= noise.size();
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(var, 1.0, 0.05);
}

TEST(Transforms, RandomErasingAppliesWithItsProbability) {
  std::vector<float> image(3 * 16 * 16, 0.0f);
  int applied = 0;
  for (uint64_t key = 0; key < 2000; ++key) {
    Rng rng(6, 6, key);
    applied += random_erasing(image.data(), 3, 16, 16, rng).empty() ? 0 : 1;
  }
  EXPECT_NEAR(applied / 2000.0, 0.25, 0.04);
  RandomErasingOptions never;
  never.probability = 0.0;
  Rng rng(6, 6, 0);
  EXPECT_TRUE(random_erasing(image.data(), 3, 16, 16, rng, never).empty());
}

TEST(Transforms, BadArgumentsAreErrorsNamingTheArgumentAndTheRule) {
  const Image image = random_image(6, 8, 13);
  Rng rng(0, 0, 0);
  expect_error([&] { resize(image, 0, 4, Interpolation::Bicubic); }, "resize: height",
               "must be positive, got 0");
  expect_error([&] { crop(image, 2, 5, 3, 4); }, "crop: window",
               "columns [5, 9) must lie inside the 6x8 image");
  expect_error([&] { center_crop(image, 3, -1); }, "center_crop: width", "got -1");
  expect_error(
      [&] {
        random_resized_crop(image, 8, rng, {0.9, 0.1});
      },
      "random_resized_crop: scale", "min <= max");
  expect_error(
      [&] {
        random_resized_crop(image, 8, rng, {0.1, 1.0}, {0.0, 2.0});
      },
      "random_resized_crop: ratio", "0 < min");
  expect_error([&] { random_resized_crop(image, 0, rng); }, "random_resized_crop: size",
               "must be positive");
  Image copy = image;
  expect_error([&] { color_jitter(copy, rng, -0.1, 0.0, 0.0); }, "color_jitter: brightness",
               "must be finite and >= 0, got -0.1");
  Image gray = random_image(4, 4, 14, 1);
  expect_error([&] { color_jitter(gray, rng, 0.1, 0.1, 0.1); }, "color_jitter: image",
               "must be RGB (3 channels), got 1");
  std::vector<float> out(3 * 16);
  expect_error([&] { normalize_into(gray, kMean, kStd, out.data()); }, "normalize_into: image",
               "3 channels");
  expect_error(
      [&] {
        normalize_into(image, kMean, {0.2f, 0.0f, 0.2f}, out.data());
      },
      "normalize_into: std[1]", "must be finite and > 0, got 0");
  RandomErasingOptions bad;
  bad.probability = 1.5;
  expect_error([&] { random_erasing(out.data(), 3, 4, 4, rng, bad); },
               "random_erasing: probability", "must be in [0, 1], got 1.5");
  bad = {};
  bad.min_area = 0.5;
  bad.max_area = 0.2;
  expect_error([&] { random_erasing(out.data(), 3, 4, 4, rng, bad); }, "random_erasing: area",
               "min_area <= max_area");
}

}  // namespace
