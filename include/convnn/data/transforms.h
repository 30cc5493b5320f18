#pragma once
// The paper's (DeiT / Swin, via timm) image transforms on 8-bit RGB images, and MixUp / CutMix on
// batches. Every random choice is drawn from the Rng passed in, in a fixed order, so a sample's
// result depends only on the key its Rng was made from.
#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "convnn/data/image.h"
#include "convnn/data/rng.h"

namespace convnn::data {

enum class Interpolation { Nearest, Bilinear, Bicubic };

/// Resizes to exactly (height, width), as PIL's Image.resize (bit-exact with Pillow 13, pass order
/// included). Bilinear and bicubic (a = -0.5, as PIL) widen their support when shrinking, i.e.
/// they antialias as PIL and torchvision's antialias=True do. Images of 1, 3 or 4 channels.
Image resize(const Image& image, int64_t height, int64_t width, Interpolation interpolation);
/// Resizes so the shorter side is `size`, keeping the aspect ratio (rounding as torchvision).
Image resize_shorter(const Image& image, int64_t size, Interpolation interpolation);
/// The central (height, width) window; zero-padded where the image is smaller.
Image center_crop(const Image& image, int64_t height, int64_t width);
/// The window of rows [top, top + height) and columns [left, left + width); must lie inside.
Image crop(const Image& image, int64_t top, int64_t left, int64_t height, int64_t width);
void horizontal_flip(Image& image);

struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};
/// torchvision's RandomResizedCrop box: up to 10 tries at an area fraction in `scale` and a
/// log-uniform aspect ratio in `ratio`, then the central crop with the ratio clamped to `ratio`.
CropBox random_resized_crop_box(int64_t height, int64_t width, Rng& rng,
                                std::array<double, 2> scale, std::array<double, 2> ratio);
Image random_resized_crop(const Image& image, int64_t size, Rng& rng,
                          std::array<double, 2> scale = {0.08, 1.0},
                          std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0},
                          Interpolation interpolation = Interpolation::Bicubic);

/// RandAugment as timm's "rand-m9-mstd0.5-inc1", the configuration the paper's recipe runs:
/// `num_ops` operations drawn uniformly (with replacement) from timm's set (AutoContrast, Equalize,
/// Invert, Rotate, Posterize, Solarize, SolarizeAdd, Color, Contrast, Brightness, Sharpness,
/// ShearX, ShearY, TranslateX, TranslateY: the RandAugment paper's 14 ops without Identity, plus
/// Invert and SolarizeAdd), with the "increasing" magnitude variants where an op has one; each
/// applied with probability `probability` at a magnitude drawn from N(magnitude, magnitude_std)
/// clipped to [0, max_magnitude] (magnitude_std = inf: uniform in [0, magnitude]); geometric ops
/// sample bilinearly and fill with `fill`. RGB images only. Ops, mappings and draw order:
/// docs/transforms.md.
struct RandAugmentOptions {
  int64_t num_ops = 2;
  double magnitude = 9.0;
  double magnitude_std = 0.5;
  double max_magnitude = 10.0;
  double probability = 0.5;
  std::array<uint8_t, 3> fill = {124, 116, 104};  // ImageNet mean, as timm
};
/// The op names in the order they are drawn from.
const std::vector<std::string>& rand_augment_ops();
/// Applies one named op at one magnitude (deterministic except for ops that draw a sign).
void apply_augment_op(Image& image, const std::string& op, double magnitude, Rng& rng,
                      const RandAugmentOptions& options = {});
void rand_augment(Image& image, Rng& rng, const RandAugmentOptions& options = {});

/// torchvision's ColorJitter with hue 0 on an RGB image: brightness, contrast and saturation
/// factors drawn from [max(0, 1 - s), 1 + s] (s = 0: that adjustment is left out, no draw),
/// applied in a random order, each as PIL's ImageEnhance.
void color_jitter(Image& image, Rng& rng, double brightness, double contrast, double saturation);

/// uint8 HWC RGB -> float32 CHW, (x / 255 - mean) / std, written to `out` (3 * H * W floats);
/// the same float32 arithmetic as ToTensor followed by Normalize.
void normalize_into(const Image& image, const std::array<float, 3>& mean,
                    const std::array<float, 3>& std, float* out);

/// timm's RandomErasing, mode "pixel", on one normalised float32 CHW image: with probability
/// `probability`, `count` boxes (area fraction in [min_area, max_area], log-uniform aspect in
/// [min_aspect, 1 / min_aspect], 10 tries each) filled with per-pixel N(0, 1) noise.
struct RandomErasingOptions {
  double probability = 0.25;
  double min_area = 0.02;
  double max_area = 1.0 / 3.0;
  double min_aspect = 0.3;
  int64_t count = 1;
};
/// Returns the boxes erased (empty when not applied), for tests.
std::vector<CropBox> random_erasing(float* chw, int64_t channels, int64_t height, int64_t width,
                                    Rng& rng, const RandomErasingOptions& options = {});

/// timm's Mixup in batch mode: with probability `probability`, one λ for the batch, from
/// Beta(cutmix_alpha) with a CutMix box (probability `switch_probability` when both are on) or
/// Beta(mixup_alpha) for a blend; each image mixed with the batch's reverse (i <-> B-1-i). CutMix
/// corrects λ to the box's real area. Targets are label-smoothed one-hot vectors mixed with the
/// same λ, so every row sums to one. An odd batch is allowed (its middle image is its own
/// partner and stays as it is); timm asks for an even one.
struct MixupOptions {
  double mixup_alpha = 0.8;   // 0: off
  double cutmix_alpha = 1.0;  // 0: off
  double switch_probability = 0.5;
  double probability = 1.0;
  double label_smoothing = 0.1;
};
struct MixResult {
  double lambda = 1.0;
  bool cutmix = false;
  CropBox box;  // the CutMix box, when cutmix
};
/// images float32 [B,C,H,W] (mixed in place), labels int64 [B]; returns soft targets float32
/// [B, num_classes] through `targets`.
MixResult mixup_cutmix(at::Tensor& images, const at::Tensor& labels, int64_t num_classes,
                       Rng& rng, const MixupOptions& options, at::Tensor& targets);

}  // namespace convnn::data
