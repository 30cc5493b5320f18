// timm's RandAugment ("rand-m9-mstd0.5-inc1", timm/data/auto_augment.py): the op set
// _RAND_INCREASING_TRANSFORMS, the level -> argument mappings of its AugmentOp table and PIL's
// image operations (data/image_ops.cpp). Draw order, as timm: all op choices, then per op its
// apply test, its magnitude noise, and a sign where its mapping draws one.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "convnn/data/transforms.h"
#include "data/image_kernels.h"

namespace convnn::data {
namespace {

enum class Op {
  AutoContrast,
  Equalize,
  Invert,
  Rotate,
  PosterizeIncreasing,
  SolarizeIncreasing,
  SolarizeAdd,
  ColorIncreasing,
  ContrastIncreasing,
  BrightnessIncreasing,
  SharpnessIncreasing,
  ShearX,
  ShearY,
  TranslateXRel,
  TranslateYRel,
};

constexpr double kLevelDenominator = 10.0;  // timm's _LEVEL_DENOM: level 10 is full strength

// timm's _randomly_negate: -v when a uniform draw exceeds one half.
double randomly_negate(double v, Rng& rng) { return rng.uniform() > 0.5 ? -v : v; }

detail::Lut lut_of(int (*f)(int, int), int arg) {
  detail::Lut lut;
  for (int i = 0; i < 256; ++i) lut[i] = static_cast<uint8_t>(f(i, arg));
  return lut;
}

// ImageOps.posterize: keep the `bits` high bits (timm skips the op at 8 or more).
void posterize(Image& image, int bits) {
  if (bits >= 8) return;
  bits = std::max(bits, 0);
  detail::apply_lut(image, lut_of([](int i, int b) { return i & ~((1 << (8 - b)) - 1); }, bits));
}

// ImageOps.solarize: invert the levels at or above the threshold.
void solarize(Image& image, int threshold) {
  detail::apply_lut(image, lut_of([](int i, int t) { return i < t ? i : 255 - i; }, threshold));
}

// timm's solarize_add: add to the levels below 128, saturating.
void solarize_add(Image& image, int add) {
  detail::apply_lut(image,
                    lut_of([](int i, int a) { return i < 128 ? std::min(255, i + a) : i; }, add));
}

// PIL's Image.rotate(degrees) about the centre, counter-clockwise, size kept: the inverse map's
// matrix, entries rounded to 15 decimals as PIL does.
std::array<double, 6> rotation(double degrees, int64_t height, int64_t width) {
  const double angle = -degrees * 3.14159265358979323846 / 180.0;
  const auto r15 = [](double v) { return std::nearbyint(v * 1e15) / 1e15; };
  const double a = r15(std::cos(angle)), b = r15(std::sin(angle));
  const double d = r15(-std::sin(angle)), e = r15(std::cos(angle));
  const double cx = static_cast<double>(width) / 2.0, cy = static_cast<double>(height) / 2.0;
  return {a, b, a * -cx + b * -cy + cx, d, e, d * -cx + e * -cy + cy};
}

float enhance_factor(double level, Rng& rng) {
  // timm's _enhance_increasing_level_to_arg: 1 +- 0.9 level / 10, at least 0.1.
  return static_cast<float>(
      std::max(0.1, 1.0 + randomly_negate(level / kLevelDenominator * 0.9, rng)));
}

void apply(Image& image, Op op, double level, Rng& rng, const RandAugmentOptions& options) {
  const double fraction = level / kLevelDenominator;
  const auto& fill = options.fill;
  const auto h = static_cast<double>(image.height), w = static_cast<double>(image.width);
  switch (op) {
    case Op::AutoContrast:
      return detail::autocontrast(image);
    case Op::Equalize:
      return detail::equalize(image);
    case Op::Invert:
      return solarize(image, 0);
    case Op::Rotate:
      return detail::affine(
          image, rotation(randomly_negate(fraction * 30.0, rng), image.height, image.width), fill);
    case Op::PosterizeIncreasing:
      return posterize(image, 4 - static_cast<int>(fraction * 4.0));
    case Op::SolarizeIncreasing:
      return solarize(image, 256 - std::min(256, static_cast<int>(fraction * 256.0)));
    case Op::SolarizeAdd:
      return solarize_add(image, std::min(128, static_cast<int>(fraction * 110.0)));
    case Op::ColorIncreasing:
      return detail::enhance(image, detail::Enhance::Color, enhance_factor(level, rng));
    case Op::ContrastIncreasing:
      return detail::enhance(image, detail::Enhance::Contrast, enhance_factor(level, rng));
    case Op::BrightnessIncreasing:
      return detail::enhance(image, detail::Enhance::Brightness, enhance_factor(level, rng));
    case Op::SharpnessIncreasing:
      return detail::enhance(image, detail::Enhance::Sharpness, enhance_factor(level, rng));
    case Op::ShearX:
      return detail::affine(image, {1, randomly_negate(fraction * 0.3, rng), 0, 0, 1, 0}, fill);
    case Op::ShearY:
      return detail::affine(image, {1, 0, 0, randomly_negate(fraction * 0.3, rng), 1, 0}, fill);
    case Op::TranslateXRel:
      return detail::affine(image, {1, 0, randomly_negate(fraction * 0.45, rng) * w, 0, 1, 0},
                            fill);
    case Op::TranslateYRel:
      return detail::affine(image, {1, 0, 0, 0, 1, randomly_negate(fraction * 0.45, rng) * h},
                            fill);
  }
}

void check_options(const RandAugmentOptions& o) {
  TORCH_CHECK(o.num_ops >= 0, "rand_augment: num_ops must be >= 0, got ", o.num_ops);
  TORCH_CHECK(std::isfinite(o.max_magnitude) && o.max_magnitude > 0.0,
              "rand_augment: max_magnitude must be finite and > 0, got ", o.max_magnitude);
  // Above max_magnitude is allowed, as timm: every draw is clipped to [0, max_magnitude].
  TORCH_CHECK(std::isfinite(o.magnitude) && o.magnitude >= 0.0,
              "rand_augment: magnitude must be finite and >= 0, got ", o.magnitude);
  TORCH_CHECK(o.magnitude_std >= 0.0, "rand_augment: magnitude_std must be >= 0 (inf: uniform in ",
              "[0, magnitude]), got ", o.magnitude_std);
  TORCH_CHECK(o.probability >= 0.0 && o.probability <= 1.0,
              "rand_augment: probability must be in [0, 1], got ", o.probability);
}

void check_rgb(const Image& image, const char* what) {
  TORCH_CHECK(image.height > 0 && image.width > 0 && image.channels == 3 &&
                  static_cast<int64_t>(image.pixels.size()) == image.height * image.width * 3,
              what, ": image must be a non-empty RGB image (3 channels, height * width * 3 ",
              "bytes), got ", image.height, "x", image.width, "x", image.channels, " with ",
              image.pixels.size(), " bytes");
}

}  // namespace

// The names of `Op`, in its order: an op is drawn by its index.
const std::vector<std::string>& rand_augment_ops() {
  static const std::vector<std::string> names = {"AutoContrast",
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
  return names;
}

void apply_augment_op(Image& image, const std::string& op, double magnitude, Rng& rng,
                      const RandAugmentOptions& options) {
  check_rgb(image, "apply_augment_op");
  TORCH_CHECK(std::isfinite(magnitude) && magnitude >= 0.0,
              "apply_augment_op: magnitude must be finite and >= 0, got ", magnitude);
  const auto& names = rand_augment_ops();
  const auto found = std::find(names.begin(), names.end(), op);
  if (found == names.end()) {
    std::string known;
    for (const auto& name : names) known += (known.empty() ? "" : ", ") + name;
    TORCH_CHECK(false, "apply_augment_op: unknown op '", op, "'; expected one of ", known);
  }
  apply(image, static_cast<Op>(found - names.begin()), magnitude, rng, options);
}

void rand_augment(Image& image, Rng& rng, const RandAugmentOptions& options) {
  check_rgb(image, "rand_augment");
  check_options(options);
  const auto count = static_cast<int64_t>(rand_augment_ops().size());
  std::vector<Op> ops(options.num_ops);
  for (auto& op : ops) op = static_cast<Op>(rng.below(count));  // with replacement, as timm
  for (const Op op : ops) {
    if (options.probability < 1.0 && rng.uniform() > options.probability) continue;
    double level = options.magnitude;
    if (std::isinf(options.magnitude_std)) {
      level = rng.uniform(0.0, options.magnitude);
    } else if (options.magnitude_std > 0.0) {
      level = options.magnitude + options.magnitude_std * rng.normal();
    }
    apply(image, op, std::clamp(level, 0.0, options.max_magnitude), rng, options);
  }
}

}  // namespace convnn::data
