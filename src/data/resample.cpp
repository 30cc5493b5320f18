// PIL's separable resampling (libImaging/Resample.c), which torchvision and timm call on PIL
// images: per output pixel, a filter centred on the output pixel's centre in input coordinates,
// its support widened by the downscale factor (so shrinking antialiases), the window clipped to
// the image and the weights renormalised; weights in 22-bit fixed point; two passes through an
// 8-bit intermediate image, in Pillow's order.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "data/image_kernels.h"

namespace convnn::data::detail {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // as PIL: 8-bit input, room for overshoot and sign
constexpr int32_t kHalf = 1 << (kPrecisionBits - 1);

double bicubic_filter(double x) {
  constexpr double a = -0.5;  // PIL's (and antialiased torch's) choice; plain torch uses -0.75
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

double bilinear_filter(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// One pass's weights: output i reads inputs [first[i], first[i] + count[i]) with
// weights[i * taps ...].
struct Coefficients {
  int64_t taps = 0;
  std::vector<int32_t> first, count, weights;
};

Coefficients coefficients(int64_t in_size, int64_t out_size, Interpolation interpolation) {
  const bool cubic = interpolation == Interpolation::Bicubic;
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = (cubic ? 2.0 : 1.0) * filter_scale;
  Coefficients c;
  c.taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(out_size * c.taps, 0);
  std::vector<double> w(c.taps);
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = (static_cast<double>(i) + 0.5) * scale;
    // (int) truncation as PIL; negative starts are clamped anyway.
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size);
    double total = 0.0;
    for (int64_t x = lo; x < hi; ++x) {
      const double arg = (static_cast<double>(x) - center + 0.5) / filter_scale;
      w[x - lo] = cubic ? bicubic_filter(arg) : bilinear_filter(arg);
      total += w[x - lo];
    }
    c.first[i] = static_cast<int32_t>(lo);
    c.count[i] = static_cast<int32_t>(hi - lo);
    for (int64_t x = 0; x < hi - lo; ++x) {
      const double k = (total != 0.0 ? w[x] / total : w[x]) * (1 << kPrecisionBits);
      c.weights[i * c.taps + x] = static_cast<int32_t>(k < 0 ? k - 0.5 : k + 0.5);
    }
  }
  return c;
}

inline uint8_t clip8(int32_t v) {
  return static_cast<uint8_t>(std::clamp(v >> kPrecisionBits, 0, 255));
}

// Rows [0, rows) of `src` (row stride in bytes) resampled along x into `dst` (dense).
template <int C>
void horizontal_pass(const uint8_t* src, int64_t stride, int64_t rows, const Coefficients& k,
                     int64_t out_w, uint8_t* dst) {
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* in = src + y * stride;
    uint8_t* out = dst + y * out_w * C;
    for (int64_t x = 0; x < out_w; ++x) {
      const int32_t* w = k.weights.data() + x * k.taps;
      const uint8_t* p = in + static_cast<int64_t>(k.first[x]) * C;
      int32_t acc[C];
      for (int c = 0; c < C; ++c) acc[c] = kHalf;
      const int32_t n = k.count[x];
      for (int32_t t = 0; t < n; ++t) {
        for (int c = 0; c < C; ++c) acc[c] += p[t * C + c] * w[t];
      }
      for (int c = 0; c < C; ++c) out[x * C + c] = clip8(acc[c]);
    }
  }
}

void horizontal_pass(const uint8_t* src, int64_t stride, int64_t rows, int64_t channels,
                     const Coefficients& k, int64_t out_w, uint8_t* dst) {
  switch (channels) {
    case 1:
      return horizontal_pass<1>(src, stride, rows, k, out_w, dst);
    case 3:
      return horizontal_pass<3>(src, stride, rows, k, out_w, dst);
    case 4:
      return horizontal_pass<4>(src, stride, rows, k, out_w, dst);
    default:
      TORCH_CHECK(false, "resize: image channels must be 1, 3 or 4, got ", channels);
  }
}

CONVNN_PIXEL_LOOP
void accumulate_row(int32_t* __restrict acc, const uint8_t* __restrict in, int64_t n,
                    int32_t weight) {
  for (int64_t j = 0; j < n; ++j) acc[j] += in[j] * weight;
}

CONVNN_PIXEL_LOOP
void clip_row(const int32_t* __restrict acc, int64_t n, uint8_t* __restrict out) {
  for (int64_t j = 0; j < n; ++j) out[j] = clip8(acc[j]);
}

// Resamples along y: every output row is a weighted sum of whole input rows, which vectorises.
void vertical_pass(const uint8_t* src, int64_t stride, int64_t row_bytes, const Coefficients& k,
                   int64_t out_h, uint8_t* dst) {
  std::vector<int32_t> acc(row_bytes);
  for (int64_t y = 0; y < out_h; ++y) {
    std::fill(acc.begin(), acc.end(), kHalf);
    const int32_t* w = k.weights.data() + y * k.taps;
    for (int32_t t = 0; t < k.count[y]; ++t) {
      accumulate_row(acc.data(), src + (k.first[y] + t) * stride, row_bytes, w[t]);
    }
    clip_row(acc.data(), row_bytes, dst + y * row_bytes);
  }
}

// PIL resizes with NEAREST as an affine scaling sampled at output pixel centres, the source
// coordinate accumulated step by step (ImagingScaleAffine); repeating the accumulation keeps the
// rare coordinates that land within rounding of an integer on PIL's side.
std::vector<int64_t> nearest_indices(int64_t in_size, int64_t out_size) {
  const double step = static_cast<double>(in_size) / static_cast<double>(out_size);
  std::vector<int64_t> index(out_size);
  double position = step * 0.5;
  for (int64_t i = 0; i < out_size; ++i, position += step) {
    index[i] = std::clamp<int64_t>(static_cast<int64_t>(position), 0, in_size - 1);
  }
  return index;
}

Image nearest_window(const Image& image, int64_t top, int64_t left, int64_t height, int64_t width,
                     int64_t out_h, int64_t out_w) {
  const int64_t c = image.channels;
  const auto rows = nearest_indices(height, out_h);
  auto columns = nearest_indices(width, out_w);
  for (auto& x : columns) x = (left + x) * c;
  Image out(out_h, out_w, c);
  for (int64_t y = 0; y < out_h; ++y) {
    const uint8_t* in = image.row(top + rows[y]);
    uint8_t* o = out.row(y);
    for (int64_t x = 0; x < out_w; ++x) {
      for (int64_t k = 0; k < c; ++k) o[x * c + k] = in[columns[x] + k];
    }
  }
  return out;
}

}  // namespace

Image resize_window(const Image& image, int64_t top, int64_t left, int64_t height, int64_t width,
                    int64_t out_h, int64_t out_w, Interpolation interpolation) {
  if (interpolation == Interpolation::Nearest) {
    return nearest_window(image, top, left, height, width, out_h, out_w);
  }
  const int64_t c = image.channels;
  TORCH_CHECK(c == 1 || c == 3 || c == 4,
              "resize: image channels must be 1, 3 or 4 for bilinear and bicubic, got ", c);
  const int64_t stride = image.width * c;
  const uint8_t* origin = image.at(top, left);
  // Like PIL, a dimension that keeps its size is not resampled (its filter is the identity).
  const bool need_h = out_w != width, need_v = out_h != height;
  Image out(out_h, out_w, c);
  if (!need_h && !need_v) {
    for (int64_t y = 0; y < out_h; ++y) std::copy_n(origin + y * stride, out_w * c, out.row(y));
    return out;
  }
  const auto kh = need_h ? coefficients(width, out_w, interpolation) : Coefficients{};
  auto kv = need_v ? coefficients(height, out_h, interpolation) : Coefficients{};
  if (!need_v) {
    horizontal_pass(origin, stride, height, c, kh, out_w, out.pixels.data());
    return out;
  }
  if (!need_h) {
    vertical_pass(origin, stride, width * c, kv, out_h, out.pixels.data());
    return out;
  }
  // Recent Pillow (checked against 13.0; 11.0 and older always go horizontal first) runs the
  // vertical pass first when the height shrinks by more than twice as many pixels as the width.
  // The 8-bit rounding between the passes makes the order visible (by a few levels at most).
  if (height - out_h > 0 && height - out_h > 2 * (width - out_w)) {
    Image vertical(out_h, width, c);
    vertical_pass(origin, stride, width * c, kv, out_h, vertical.pixels.data());
    horizontal_pass(vertical.pixels.data(), width * c, out_h, c, kh, out_w, out.pixels.data());
    return out;
  }
  // Horizontal first, on only the input rows the vertical pass reads.
  const int32_t row_first = kv.first.front();
  const int32_t row_last = kv.first.back() + kv.count.back();
  for (auto& first : kv.first) first -= row_first;
  Image horizontal(row_last - row_first, out_w, c);
  horizontal_pass(origin + row_first * stride, stride, row_last - row_first, c, kh, out_w,
                  horizontal.pixels.data());
  vertical_pass(horizontal.pixels.data(), out_w * c, out_w * c, kv, out_h, out.pixels.data());
  return out;
}

}  // namespace convnn::data::detail
