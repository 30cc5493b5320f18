// The in-memory source: crop with padding, flip and normalisation of uint8 [N,C,H,W] images.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "convnn/data/rng.h"
#include "convnn/data/sample_source.h"

namespace convnn::data {
namespace {

// The samples' augmentation stream; the loader's shuffle has another, so turning one on never
// changes the other.
constexpr uint64_t kAugmentStream = 0x6175676d656eULL;  // "augmen"

struct Augment {
  int64_t dy = 0, dx = 0;  // window offset in the padded image, in [0, 2 * crop_padding]
  bool flip = false;
};

// Drawn in a fixed order whatever is enabled, so each choice depends only on its key.
Augment augment_of(const ImageSetTransform& t, uint64_t seed, int64_t epoch, int64_t sample) {
  Rng rng(kAugmentStream, seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(sample));
  Augment a;
  a.dy = rng.below(2 * t.crop_padding + 1);
  a.dx = rng.below(2 * t.crop_padding + 1);
  a.flip = rng.uniform() < t.hflip;
  return a;
}

struct Geometry {
  int64_t channels, height, width, padding;
};

// out[c][y][x] = table[c][padded[c][y + dy][x' + dx]] with x' = W - 1 - x when flipped (crop,
// then flip), where padded is the image with `padding` zeros on every side.
void write_sample(const uint8_t* src, float* dst, const Augment& a, const Geometry& g,
                  const float* lut) {
  const int64_t h = g.height, w = g.width;
  for (int64_t c = 0; c < g.channels; ++c) {
    const float* table = lut + 256 * c;
    for (int64_t y = 0; y < h; ++y) {
      float* row = dst + (c * h + y) * w;
      const int64_t sy = y + a.dy - g.padding;
      if (sy < 0 || sy >= h) {
        std::fill(row, row + w, table[0]);
        continue;
      }
      const uint8_t* src_row = src + (c * h + sy) * w;
      for (int64_t x = 0; x < w; ++x) {
        const int64_t sx = (a.flip ? w - 1 - x : x) + a.dx - g.padding;
        row[x] = table[sx >= 0 && sx < w ? src_row[sx] : 0];
      }
    }
  }
}

// Every uint8 value's float, normalised: one lookup per pixel instead of a divide.
std::vector<float> value_table(const ImageSetTransform& t, int64_t channels) {
  std::vector<float> lut(static_cast<size_t>(256 * channels));
  for (int64_t c = 0; c < channels; ++c) {
    for (int v = 0; v < 256; ++v) {
      double x = v / 255.0;
      if (!t.mean.empty()) x = (x - t.mean[c]) / t.std[c];
      lut[static_cast<size_t>(256 * c + v)] = static_cast<float>(x);
    }
  }
  return lut;
}

void check_set(const ImageSet& set) {
  TORCH_CHECK(set.images.defined() && set.labels.defined(),
              "DataLoader: the image set has no images or no labels");
  TORCH_CHECK(set.images.dim() == 4 && set.images.scalar_type() == at::kByte &&
                  set.images.device().is_cpu(),
              "DataLoader: images must be uint8 [N,C,H,W] on the CPU, got ",
              set.images.scalar_type(), " ", set.images.sizes(), " on ", set.images.device());
  TORCH_CHECK(set.labels.dim() == 1 && set.labels.scalar_type() == at::kLong &&
                  set.labels.device().is_cpu(),
              "DataLoader: labels must be int64 [N] on the CPU, got ", set.labels.scalar_type(),
              " ", set.labels.sizes(), " on ", set.labels.device());
  TORCH_CHECK(set.images.size(0) == set.labels.size(0), "DataLoader: ", set.images.size(0),
              " images but ", set.labels.size(0), " labels");
}

void check_normalisation(const ImageSetTransform& t, int64_t channels) {
  TORCH_CHECK(t.mean.size() == t.std.size(), "DataLoader: mean has ", t.mean.size(),
              " values and std has ", t.std.size(), "; give both (one per channel) or neither");
  TORCH_CHECK(t.mean.empty() || static_cast<int64_t>(t.mean.size()) == channels,
              "DataLoader: mean and std have ", t.mean.size(), " values, the images have ",
              channels, " channels");
  for (size_t c = 0; c < t.mean.size(); ++c) {
    TORCH_CHECK(std::isfinite(t.mean[c]), "DataLoader: mean[", c, "] must be finite, got ",
                t.mean[c]);
    TORCH_CHECK(std::isfinite(t.std[c]) && t.std[c] > 0, "DataLoader: std[", c,
                "] must be finite and > 0, got ", t.std[c]);
  }
}

void check_transform(const ImageSetTransform& t, int64_t channels) {
  TORCH_CHECK(t.crop_padding >= 0, "DataLoader: crop_padding must be >= 0, got ",
              t.crop_padding);
  TORCH_CHECK(t.hflip >= 0.0 && t.hflip <= 1.0, "DataLoader: hflip must be in [0, 1], got ",
              t.hflip);
  check_normalisation(t, channels);
}

class ImageSetSource final : public SampleSource {
 public:
  ImageSetSource(ImageSet set, ImageSetTransform transform)
      : set_(std::move(set)), transform_(std::move(transform)) {
    // write() reads raw pointers with dense strides.
    set_.images = set_.images.contiguous();
    set_.labels = set_.labels.contiguous();
    geometry_ = {set_.channels(), set_.height(), set_.width(), transform_.crop_padding};
    lut_ = value_table(transform_, geometry_.channels);
  }

  int64_t size() const override { return set_.size(); }
  std::array<int64_t, 3> sample_shape() const override {
    return {geometry_.channels, geometry_.height, geometry_.width};
  }
  const std::vector<std::string>& class_names() const override { return set_.class_names; }
  int64_t label(int64_t index) const override { return set_.labels.data_ptr<int64_t>()[index]; }

  bool write(int64_t index, uint64_t seed, int64_t epoch, float* out,
             std::string&) const override {
    const auto* images = set_.images.data_ptr<uint8_t>();
    write_sample(images + index * sample_numel(), out, augment_of(transform_, seed, epoch, index),
                 geometry_, lut_.data());
    return true;
  }

 private:
  ImageSet set_;
  ImageSetTransform transform_;
  Geometry geometry_{};
  std::vector<float> lut_;
};

}  // namespace

std::shared_ptr<const SampleSource> image_set_source(ImageSet set, ImageSetTransform transform) {
  check_set(set);
  check_transform(transform, set.images.size(1));
  return std::make_shared<ImageSetSource>(std::move(set), std::move(transform));
}

}  // namespace convnn::data
