// Geometry (resize, crops, flip, RandomResizedCrop), colour jitter, normalisation and random
// erasing, with torchvision's and timm's semantics on PIL images (see docs/transforms.md).
#include "convnn/data/transforms.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "data/image_kernels.h"

namespace convnn::data {
namespace {

// Python's round(): half to even (the default floating-point rounding mode).
int64_t py_round(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

void check_image(const Image& image, const char* what) {
  TORCH_CHECK(image.height > 0 && image.width > 0, what, ": image must be non-empty, got ",
              image.height, "x", image.width);
  TORCH_CHECK(image.channels > 0, what, ": image channels must be positive, got ", image.channels);
  TORCH_CHECK(
      static_cast<int64_t>(image.pixels.size()) == image.height * image.width * image.channels,
      what, ": image holds ", image.pixels.size(), " bytes, expected height * width * ",
      "channels = ", image.height * image.width * image.channels);
}

void check_rgb(const Image& image, const char* what) {
  check_image(image, what);
  TORCH_CHECK(image.channels == 3, what, ": image must be RGB (3 channels), got ", image.channels);
}

void check_size(int64_t size, const char* what, const char* name) {
  TORCH_CHECK(size > 0, what, ": ", name, " must be positive, got ", size);
}

// A (min, max) pair: finite, ordered, min >= 0 and max > 0 (`name` says what else holds).
void check_range(const std::array<double, 2>& range, const char* what, const char* name,
                 bool min_positive) {
  TORCH_CHECK(std::isfinite(range[0]) && std::isfinite(range[1]) && range[0] <= range[1] &&
                  range[0] >= 0.0 && range[1] > 0.0 && (!min_positive || range[0] > 0.0),
              what, ": ", name, " must be a finite (min, max) with ",
              min_positive ? "0 < min" : "0 <= min", " <= max and max > 0, got (", range[0], ", ",
              range[1], ")");
}

void check_probability(double p, const char* what, const char* name) {
  TORCH_CHECK(p >= 0.0 && p <= 1.0, what, ": ", name, " must be in [0, 1], got ", p);
}

}  // namespace

Image resize(const Image& image, int64_t height, int64_t width, Interpolation interpolation) {
  check_image(image, "resize");
  check_size(height, "resize", "height");
  check_size(width, "resize", "width");
  return detail::resize_window(image, 0, 0, image.height, image.width, height, width,
                               interpolation);
}

Image resize_shorter(const Image& image, int64_t size, Interpolation interpolation) {
  check_image(image, "resize_shorter");
  check_size(size, "resize_shorter", "size");
  // torchvision: the long side is int(size * long / short), truncated.
  const bool portrait = image.width <= image.height;
  const int64_t shorter = portrait ? image.width : image.height;
  const int64_t longer = portrait ? image.height : image.width;
  const auto scaled = static_cast<int64_t>(static_cast<double>(size) * static_cast<double>(longer) /
                                           static_cast<double>(shorter));
  return portrait ? resize(image, scaled, size, interpolation)
                  : resize(image, size, scaled, interpolation);
}

Image center_crop(const Image& image, int64_t height, int64_t width) {
  check_image(image, "center_crop");
  check_size(height, "center_crop", "height");
  check_size(width, "center_crop", "width");
  // torchvision: a side longer than the image is zero-padded ((d - n) // 2 before), otherwise the
  // window starts at round((n - d) / 2).
  const auto start = [](int64_t n, int64_t d) {
    return d > n ? -((d - n) / 2) : py_round(static_cast<double>(n - d) / 2.0);
  };
  const int64_t top = start(image.height, height), left = start(image.width, width);
  if (height <= image.height && width <= image.width) return crop(image, top, left, height, width);
  const int64_t c = image.channels;
  Image out(height, width, c);
  const int64_t x0 = std::max<int64_t>(0, -left), x1 = std::min(width, image.width - left);
  for (int64_t y = std::max<int64_t>(0, -top); y < std::min(height, image.height - top); ++y) {
    std::copy_n(image.at(y + top, x0 + left), (x1 - x0) * c, out.at(y, x0));
  }
  return out;
}

Image crop(const Image& image, int64_t top, int64_t left, int64_t height, int64_t width) {
  check_image(image, "crop");
  check_size(height, "crop", "height");
  check_size(width, "crop", "width");
  TORCH_CHECK(top >= 0 && left >= 0 && top + height <= image.height && left + width <= image.width,
              "crop: window rows [", top, ", ", top + height, ") and columns [", left, ", ",
              left + width, ") must lie inside the ", image.height, "x", image.width, " image");
  Image out(height, width, image.channels);
  for (int64_t y = 0; y < height; ++y) {
    std::copy_n(image.at(top + y, left), width * image.channels, out.row(y));
  }
  return out;
}

namespace {

// Swaps pixels from both ends of every row; the channel count is a template argument so that
// the RGB case compiles to three byte swaps instead of a loop per pixel.
template <int C>
void flip_rows(Image& image) {
  const int64_t c = C > 0 ? C : image.channels;
  for (int64_t y = 0; y < image.height; ++y) {
    uint8_t* a = image.row(y);
    uint8_t* b = a + (image.width - 1) * c;
    for (; a < b; a += c, b -= c) {
      for (int64_t k = 0; k < c; ++k) std::swap(a[k], b[k]);
    }
  }
}

}  // namespace

void horizontal_flip(Image& image) {
  check_image(image, "horizontal_flip");
  image.channels == 3 ? flip_rows<3>(image) : flip_rows<0>(image);
}

CropBox random_resized_crop_box(int64_t height, int64_t width, Rng& rng,
                                std::array<double, 2> scale, std::array<double, 2> ratio) {
  const char* what = "random_resized_crop";
  check_size(height, what, "height");
  check_size(width, what, "width");
  check_range(scale, what, "scale", false);
  check_range(ratio, what, "ratio", true);
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(ratio[0]), log_hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.uniform(scale[0], scale[1]);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int64_t w = py_round(std::sqrt(target * aspect));
    const int64_t h = py_round(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int64_t top = rng.below(height - h + 1);
      const int64_t left = rng.below(width - w + 1);
      return {top, left, h, w};
    }
  }
  // Fallback: the central crop, its aspect ratio clamped to `ratio`.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < ratio[0]) {
    h = py_round(static_cast<double>(w) / ratio[0]);
  } else if (in_ratio > ratio[1]) {
    w = py_round(static_cast<double>(h) * ratio[1]);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

Image random_resized_crop(const Image& image, int64_t size, Rng& rng, std::array<double, 2> scale,
                          std::array<double, 2> ratio, Interpolation interpolation) {
  check_image(image, "random_resized_crop");
  check_size(size, "random_resized_crop", "size");
  const CropBox box = random_resized_crop_box(image.height, image.width, rng, scale, ratio);
  return detail::resize_window(image, box.top, box.left, box.height, box.width, size, size,
                               interpolation);
}

void color_jitter(Image& image, Rng& rng, double brightness, double contrast, double saturation) {
  check_rgb(image, "color_jitter");
  const std::array<double, 3> strength = {brightness, contrast, saturation};
  const char* names[] = {"brightness", "contrast", "saturation"};
  for (int i = 0; i < 3; ++i) {
    TORCH_CHECK(std::isfinite(strength[i]) && strength[i] >= 0.0, "color_jitter: ", names[i],
                " must be finite and >= 0, got ", strength[i]);
  }
  // torchvision's order of draws: the permutation, then each enabled factor.
  std::array<int, 3> order = {0, 1, 2};
  for (int i = 2; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  std::array<double, 3> factor = {1.0, 1.0, 1.0};
  for (int i = 0; i < 3; ++i) {
    if (strength[i] > 0.0) {
      factor[i] = rng.uniform(std::max(0.0, 1.0 - strength[i]), 1.0 + strength[i]);
    }
  }
  constexpr detail::Enhance kinds[] = {detail::Enhance::Brightness, detail::Enhance::Contrast,
                                       detail::Enhance::Color};
  for (const int i : order) {
    if (strength[i] > 0.0) detail::enhance(image, kinds[i], static_cast<float>(factor[i]));
  }
}

void normalize_into(const Image& image, const std::array<float, 3>& mean,
                    const std::array<float, 3>& std, float* out) {
  check_rgb(image, "normalize_into");
  TORCH_CHECK(out != nullptr, "normalize_into: out must not be null");
  // One table per channel computes exactly ToTensor's x / 255 then Normalize's (x - m) / s in
  // float32, and turns the per-pixel work into three look-ups.
  float table[3][256];
  for (int c = 0; c < 3; ++c) {
    TORCH_CHECK(std::isfinite(mean[c]), "normalize_into: mean[", c, "] must be finite, got ",
                mean[c]);
    TORCH_CHECK(std::isfinite(std[c]) && std[c] > 0.0f, "normalize_into: std[", c,
                "] must be finite and > 0, got ", std[c]);
    for (int v = 0; v < 256; ++v) table[c][v] = (static_cast<float>(v) / 255.0f - mean[c]) / std[c];
  }
  const int64_t plane = image.height * image.width;
  const uint8_t* p = image.pixels.data();
  float* r = out;
  float* g = out + plane;
  float* b = out + 2 * plane;
  for (int64_t i = 0; i < plane; ++i, p += 3) {
    r[i] = table[0][p[0]];
    g[i] = table[1][p[1]];
    b[i] = table[2][p[2]];
  }
}

namespace {

// `n` N(0, 1) floats, both Box-Muller outputs of each pair of uniforms used.
void fill_normal(float* out, int64_t n, Rng& rng) {
  constexpr double two_pi = 6.283185307179586;
  for (int64_t i = 0; i < n; i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(1.0 - rng.uniform()));
    const double angle = two_pi * rng.uniform();
    out[i] = static_cast<float>(radius * std::cos(angle));
    if (i + 1 < n) out[i + 1] = static_cast<float>(radius * std::sin(angle));
  }
}

void check_erasing(const RandomErasingOptions& o) {
  const char* what = "random_erasing";
  check_probability(o.probability, what, "probability");
  TORCH_CHECK(o.min_area > 0.0 && o.min_area <= o.max_area && o.max_area <= 1.0, what,
              ": area fractions must satisfy 0 < min_area <= max_area <= 1, got min_area ",
              o.min_area, " and max_area ", o.max_area);
  TORCH_CHECK(o.min_aspect > 0.0 && o.min_aspect <= 1.0, what,
              ": min_aspect must be in (0, 1], got ", o.min_aspect);
  TORCH_CHECK(o.count >= 1, what, ": count must be >= 1, got ", o.count);
}

}  // namespace

std::vector<CropBox> random_erasing(float* chw, int64_t channels, int64_t height, int64_t width,
                                    Rng& rng, const RandomErasingOptions& options) {
  check_erasing(options);
  TORCH_CHECK(chw != nullptr, "random_erasing: chw must not be null");
  check_size(channels, "random_erasing", "channels");
  check_size(height, "random_erasing", "height");
  check_size(width, "random_erasing", "width");
  std::vector<CropBox> boxes;
  if (rng.uniform() > options.probability) return boxes;
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(options.min_aspect), log_hi = -log_lo;
  std::vector<float> noise;
  for (int64_t k = 0; k < options.count; ++k) {
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double target = rng.uniform(options.min_area, options.max_area) * area /
                            static_cast<double>(options.count);
      const double aspect = std::exp(rng.uniform(log_lo, log_hi));
      // timm's convention (h from area * aspect), the transpose of RandomResizedCrop's.
      const int64_t h = py_round(std::sqrt(target * aspect));
      const int64_t w = py_round(std::sqrt(target / aspect));
      if (!(w < width && h < height)) continue;
      const int64_t top = rng.below(height - h + 1), left = rng.below(width - w + 1);
      noise.resize(channels * h * w);
      fill_normal(noise.data(), static_cast<int64_t>(noise.size()), rng);
      const float* src = noise.data();
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t y = 0; y < h; ++y, src += w) {
          std::copy_n(src, w, chw + (c * height + top + y) * width + left);
        }
      }
      boxes.push_back({top, left, h, w});
      break;
    }
  }
  return boxes;
}

}  // namespace convnn::data
