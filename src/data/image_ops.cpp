// PIL's ImageEnhance, ImageOps and affine-transform semantics on 8-bit RGB images, the way
// timm's RandAugment and torchvision's ColorJitter call them on PIL images.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "data/image_kernels.h"

namespace convnn::data::detail {
namespace {

size_t byte_count(const Image& image) { return image.pixels.size(); }

CONVNN_PIXEL_LOOP
void gray_pixels(const uint8_t* __restrict in, int64_t pixels, uint8_t* __restrict out) {
  for (int64_t i = 0; i < pixels; ++i) {
    const uint8_t l = luma(in + 3 * i);
    out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = l;
  }
}

CONVNN_PIXEL_LOOP
int64_t luma_sum(const uint8_t* __restrict in, int64_t pixels) {
  int64_t sum = 0;
  for (int64_t i = 0; i < pixels; ++i) sum += luma(in + 3 * i);
  return sum;
}

// ImageEnhance.Color's degenerate image: the "L" conversion, back to RGB.
Image grayscale(const Image& image) {
  Image gray(image.height, image.width, 3);
  gray_pixels(image.pixels.data(), image.height * image.width, gray.pixels.data());
  return gray;
}

// ImageEnhance.Contrast's degenerate image: the mean of the "L" image, rounded half up.
Image mean_gray(const Image& image) {
  const int64_t pixels = image.height * image.width;
  const int64_t sum = luma_sum(image.pixels.data(), pixels);
  const double mean = pixels > 0 ? static_cast<double>(sum) / static_cast<double>(pixels) : 0.0;
  Image out(image.height, image.width, 3);
  std::memset(out.pixels.data(), static_cast<int>(mean + 0.5), byte_count(out));
  return out;
}

// ImageEnhance.Sharpness's degenerate image: ImageFilter.SMOOTH, the 3x3 kernel
// [1 1 1; 1 5 1; 1 1 1] / 13 rounded to nearest, the border rows and columns left as they are.
// (2 S + 13) / 26 is PIL's float sum + 0.5 truncated: S / 13 is never within float error of a
// half, so the two agree exactly.
CONVNN_PIXEL_LOOP
void smooth_row(const uint8_t* __restrict above, const uint8_t* __restrict mid,
                const uint8_t* __restrict below, int64_t c, int64_t end, uint8_t* __restrict out) {
  for (int64_t j = c; j < end; ++j) {
    const int32_t s = above[j - c] + above[j] + above[j + c] + mid[j - c] + 5 * mid[j] +
                      mid[j + c] + below[j - c] + below[j] + below[j + c];
    out[j] = static_cast<uint8_t>((2 * s + 13) / 26);
  }
}

Image smooth(const Image& image) {
  Image out = image;
  const int64_t h = image.height, w = image.width, c = image.channels;
  if (h < 3 || w < 3) return out;
  for (int64_t y = 1; y < h - 1; ++y) {
    smooth_row(image.row(y - 1), image.row(y), image.row(y + 1), c, (w - 1) * c, out.row(y));
  }
  return out;
}

CONVNN_PIXEL_LOOP
void blend_bytes(uint8_t* __restrict p, const uint8_t* __restrict d, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) {
    const float base = static_cast<float>(d[i]);
    const float v = base + factor * (static_cast<float>(p[i]) - base);
    p[i] = static_cast<uint8_t>(static_cast<int32_t>(std::min(std::max(v, 0.0f), 255.0f)));
  }
}

}  // namespace

void blend(Image& image, const Image& degenerate, float factor) {
  blend_bytes(image.pixels.data(), degenerate.pixels.data(), byte_count(image), factor);
}

void enhance(Image& image, Enhance kind, float factor) {
  switch (kind) {
    case Enhance::Color:
      return blend(image, grayscale(image), factor);
    case Enhance::Contrast:
      return blend(image, mean_gray(image), factor);
    case Enhance::Brightness:
      return blend(image, Image(image.height, image.width, 3), factor);
    case Enhance::Sharpness:
      return blend(image, smooth(image), factor);
  }
}

void apply_luts(Image& image, const std::array<Lut, 3>& luts) {
  uint8_t* p = image.pixels.data();
  const int64_t pixels = image.height * image.width;
  for (int64_t i = 0; i < pixels; ++i, p += 3) {
    p[0] = luts[0][p[0]];
    p[1] = luts[1][p[1]];
    p[2] = luts[2][p[2]];
  }
}

void apply_lut(Image& image, const Lut& lut) {
  for (auto& v : image.pixels) v = lut[v];
}

std::array<std::array<int64_t, 256>, 3> histograms(const Image& image) {
  std::array<std::array<int64_t, 256>, 3> h{};
  const uint8_t* p = image.pixels.data();
  const int64_t pixels = image.height * image.width;
  for (int64_t i = 0; i < pixels; ++i, p += 3) {
    ++h[0][p[0]];
    ++h[1][p[1]];
    ++h[2][p[2]];
  }
  return h;
}

void autocontrast(Image& image) {
  const auto hist = histograms(image);
  std::array<Lut, 3> luts;
  for (int c = 0; c < 3; ++c) {
    int lo = 0, hi = 255;
    while (lo < 256 && hist[c][lo] == 0) ++lo;
    while (hi >= 0 && hist[c][hi] == 0) --hi;
    for (int i = 0; i < 256; ++i) {
      if (hi <= lo) {
        luts[c][i] = static_cast<uint8_t>(i);
        continue;
      }
      const double scale = 255.0 / (hi - lo), offset = -lo * scale;
      luts[c][i] = static_cast<uint8_t>(std::clamp(static_cast<int>(i * scale + offset), 0, 255));
    }
  }
  apply_luts(image, luts);
}

void equalize(Image& image) {
  const auto hist = histograms(image);
  std::array<Lut, 3> luts;
  for (int c = 0; c < 3; ++c) {
    int64_t total = 0, last = 0, used = 0;
    for (int i = 0; i < 256; ++i) {
      if (hist[c][i] == 0) continue;
      total += hist[c][i];
      last = hist[c][i];
      ++used;
    }
    // PIL: the step leaves out the last used level, so the brightest level maps to ~255.
    const int64_t step = used <= 1 ? 0 : (total - last) / 255;
    int64_t n = step / 2;
    for (int i = 0; i < 256; ++i) {
      luts[c][i] = step == 0 ? static_cast<uint8_t>(i)
                             : static_cast<uint8_t>(std::min<int64_t>(n / step, 255));
      n += hist[c][i];
    }
  }
  apply_luts(image, luts);
}

namespace {

// One output row of PIL's bilinear affine filter: sample at pixel centres, fill outside the
// image, edge pixels repeated, the double result truncated.
CONVNN_PIXEL_LOOP
void affine_row(const Image& image, const std::array<double, 6>& m, int64_t y,
                const std::array<uint8_t, 3>& fill, uint8_t* __restrict o) {
  const int64_t h = image.height, w = image.width;
  const double wd = static_cast<double>(w), hd = static_cast<double>(h);
  const double yc = static_cast<double>(y) + 0.5;
  for (int64_t x = 0; x < w; ++x, o += 3) {
    const double xc = static_cast<double>(x) + 0.5;
    const double xin = m[0] * xc + m[1] * yc + m[2];
    const double yin = m[3] * xc + m[4] * yc + m[5];
    if (!(xin >= 0.0 && xin < wd && yin >= 0.0 && yin < hd)) {
      o[0] = fill[0], o[1] = fill[1], o[2] = fill[2];
      continue;
    }
    // xin, yin >= 0 here, so truncating xin + 0.5 floors xin - 0.5 (std::floor is a library
    // call on baseline x86-64).
    const int64_t x0 = static_cast<int64_t>(xin + 0.5) - 1;
    const int64_t y0 = static_cast<int64_t>(yin + 0.5) - 1;
    const double dx = xin - 0.5 - static_cast<double>(x0);
    const double dy = yin - 0.5 - static_cast<double>(y0);
    const int64_t xa = std::max<int64_t>(x0, 0) * 3, xb = std::min<int64_t>(x0 + 1, w - 1) * 3;
    const uint8_t* ra = image.row(std::max<int64_t>(y0, 0));
    const uint8_t* rb = image.row(std::min<int64_t>(y0 + 1, h - 1));
    for (int c = 0; c < 3; ++c) {
      const double top = ra[xa + c] + (ra[xb + c] - ra[xa + c]) * dx;
      const double bottom = rb[xa + c] + (rb[xb + c] - rb[xa + c]) * dx;
      o[c] = static_cast<uint8_t>(top + (bottom - top) * dy);
    }
  }
}

}  // namespace

void affine(Image& image, const std::array<double, 6>& m, const std::array<uint8_t, 3>& fill) {
  Image out(image.height, image.width, 3);
  for (int64_t y = 0; y < image.height; ++y) affine_row(image, m, y, fill, out.row(y));
  image = std::move(out);
}

}  // namespace convnn::data::detail
