#pragma once
// Image files as a loader source: per sample, read and decode the file, then the training
// transforms of the paper's (DeiT / Swin, timm) recipe or the validation transforms:
//   training:   RandomResizedCrop(image_size, scale, ratio, bicubic) -> flip -> RandAugment ->
//               colour jitter -> normalise -> random erasing
//   validation: resize the shorter side to val_resize (bicubic) -> centre crop image_size ->
//               normalise
// Each step is the function of transforms.h; this file only chains them, with one Rng per
// sample keyed by (seed, epoch, sample index). docs/data.md describes the whole pipeline.
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "convnn/data/image_codec.h"
#include "convnn/data/image_folder.h"
#include "convnn/data/sample_source.h"
#include "convnn/data/transforms.h"

namespace convnn::data {

/// ImageNet's per-channel mean and standard deviation (torchvision's, in [0,1] units).
constexpr std::array<float, 3> kImageNetMean = {0.485f, 0.456f, 0.406f};
constexpr std::array<float, 3> kImageNetStd = {0.229f, 0.224f, 0.225f};

/// The defaults are plain training (RandomResizedCrop and flip, as torchvision's ImageNet
/// example); the trainer fills in the recipe it resolved (train::TrainConfig).
struct ImageTransformOptions {
  bool training = true;
  int64_t image_size = 224;  // side of the square output
  // Training.
  std::array<double, 2> scale = {0.08, 1.0};
  std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0};
  Interpolation interpolation = Interpolation::Bicubic;
  double hflip = 0.5;
  std::optional<RandAugmentOptions> rand_augment;  // nullopt: off
  double color_jitter = 0.0;  // brightness = contrast = saturation strength; 0: off
  double reprob = 0.0;        // random erasing probability (mode pixel); 0: off
  // Validation.
  int64_t val_resize = 0;  // shorter side before the centre crop; 0: floor(image_size / 0.875)
  // Both.
  std::array<float, 3> mean = kImageNetMean, std = kImageNetStd;
  // Reading: a file whose header claims more pixels is refused before decoding (read_image), and
  // so skipped, or fatal in strict mode, like any other unreadable file.
  int64_t max_image_pixels = kDefaultMaxImagePixels;
};

/// floor(image_size / 0.875), timm's and torchvision's crop_pct rule: 256 for 224.
int64_t default_val_resize(int64_t image_size);

/// Milliseconds spent per stage, summed over the samples written with them (convnn bench).
struct StageTimes {
  double read_decode = 0, crop = 0, flip_rand_augment = 0, color_jitter = 0, normalize_erase = 0;
  int64_t samples = 0;
};

class ImageFolderSource final : public SampleSource {
 public:
  /// Checks the options (c10::Error naming the option, its value and the rule).
  ImageFolderSource(FileList files, ImageTransformOptions options);

  int64_t size() const override { return files_.size(); }
  std::array<int64_t, 3> sample_shape() const override;
  const std::vector<std::string>& class_names() const override { return files_.class_names; }
  int64_t label(int64_t index) const override;
  bool write(int64_t index, uint64_t seed, int64_t epoch, float* out,
             std::string& error) const override {
    return write_timed(index, seed, epoch, out, error, nullptr);
  }
  /// write(), adding each stage's time to `times` when it is not null.
  bool write_timed(int64_t index, uint64_t seed, int64_t epoch, float* out, std::string& error,
                   StageTimes* times) const;

  const FileList& files() const { return files_; }
  const ImageTransformOptions& options() const { return options_; }

 private:
  void train_transform(Image image, Rng& rng, float* out, StageTimes* times) const;
  void val_transform(const Image& image, float* out) const;

  FileList files_;
  ImageTransformOptions options_;
};

}  // namespace convnn::data
