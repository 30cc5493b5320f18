#pragma once
// Pixel kernels shared by the public transforms (transforms.cpp, rand_augment.cpp): PIL's
// resampling, ImageEnhance blends, ImageOps look-up tables and affine warps, on 8-bit HWC images.
// Plain loops over raw rows, no torch types, so that the compiler vectorises them and a sample's
// augmentation never touches the allocator of the training thread.
#include <array>
#include <cstdint>

#include "convnn/data/image.h"
#include "convnn/data/transforms.h"

// The library is built for baseline x86-64 (SSE2), where widening 8-bit pixels to float and
// back takes long instruction sequences; the per-byte loops are also compiled for AVX2 and picked
// at load time. Both clones do the same IEEE float operations (no FMA), so results are identical.
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#define CONVNN_PIXEL_LOOP __attribute__((target_clones("avx2", "default")))
#else
#define CONVNN_PIXEL_LOOP
#endif

namespace convnn::data::detail {

/// PIL's Image.resize of the window (top, left, height, width) of `image` to (out_h, out_w): the
/// window is treated as the whole image (the filter support stops at its border), so cropping
/// and resizing need no intermediate copy.
Image resize_window(const Image& image, int64_t top, int64_t left, int64_t height, int64_t width,
                    int64_t out_h, int64_t out_w, Interpolation interpolation);

/// ImageEnhance: out = degenerate + factor * (image - degenerate), in float, clipped to [0, 255]
/// and truncated, as PIL's Image.blend. `degenerate` has the image's shape.
void blend(Image& image, const Image& degenerate, float factor);

enum class Enhance { Color, Contrast, Brightness, Sharpness };
/// PIL's ImageEnhance.<kind>(image).enhance(factor) on an RGB image.
void enhance(Image& image, Enhance kind, float factor);

/// PIL's "L" conversion of an RGB pixel: ITU-R 601-2 luma in 16-bit fixed point, rounded.
inline uint8_t luma(const uint8_t* rgb) {
  return static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

using Lut = std::array<uint8_t, 256>;
/// Maps every channel c of every pixel through luts[c].
void apply_luts(Image& image, const std::array<Lut, 3>& luts);
/// The same table for every channel.
void apply_lut(Image& image, const Lut& lut);
/// Per-channel histograms (256 bins each) of an RGB image.
std::array<std::array<int64_t, 256>, 3> histograms(const Image& image);

/// PIL's ImageOps.autocontrast (cutoff 0): each channel's [min, max] stretched to [0, 255].
void autocontrast(Image& image);
/// PIL's ImageOps.equalize: each channel through its cumulative-histogram table.
void equalize(Image& image);

/// PIL's Image.transform(size, AFFINE, matrix, BILINEAR, fillcolor): output pixel (x, y) samples
/// the input at (a x' + b y' + c, d x' + e y' + f) with x' = x + 0.5, y' = y + 0.5; samples
/// outside the image take `fill`.
void affine(Image& image, const std::array<double, 6>& matrix, const std::array<uint8_t, 3>& fill);

}  // namespace convnn::data::detail
