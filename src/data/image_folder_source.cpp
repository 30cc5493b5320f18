// The image-file source: read + decode, then the training or validation chain of transforms.h.
#include "convnn/data/image_folder_source.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cmath>

#include "convnn/data/image_codec.h"

namespace convnn::data {
namespace {

// The per-sample stream of image files (the in-memory sets use another).
constexpr uint64_t kImageStream = 0x696d616765ULL;  // "image"

// Adds the time since the previous mark to a stage's total; does nothing without `times`.
class StageClock {
 public:
  explicit StageClock(StageTimes* times) : times_(times) {
    if (times_) last_ = std::chrono::steady_clock::now();
  }
  void mark(double StageTimes::*stage) {
    if (!times_) return;
    const auto now = std::chrono::steady_clock::now();
    times_->*stage += std::chrono::duration<double, std::milli>(now - last_).count();
    last_ = now;
  }

 private:
  StageTimes* times_;
  std::chrono::steady_clock::time_point last_;
};

void check_range(const std::array<double, 2>& range, const char* name, bool min_positive) {
  TORCH_CHECK(std::isfinite(range[0]) && std::isfinite(range[1]) && range[0] <= range[1] &&
                  range[1] > 0.0 && (min_positive ? range[0] > 0.0 : range[0] >= 0.0),
              "ImageFolderSource: ", name, " must be a finite (min, max) with ",
              min_positive ? "0 < min" : "0 <= min", " <= max and max > 0, got (", range[0],
              ", ", range[1], ")");
}

void check_options(const ImageTransformOptions& o) {
  TORCH_CHECK(o.image_size >= 1, "ImageFolderSource: image_size must be >= 1, got ",
              o.image_size);
  TORCH_CHECK(o.val_resize == 0 || o.val_resize >= o.image_size,
              "ImageFolderSource: val_resize must be 0 (image_size / 0.875) or >= image_size (",
              o.image_size, "), got ", o.val_resize);
  check_range(o.scale, "scale", false);
  check_range(o.ratio, "ratio", true);
  TORCH_CHECK(o.hflip >= 0.0 && o.hflip <= 1.0, "ImageFolderSource: hflip must be in [0, 1], got ",
              o.hflip);
  TORCH_CHECK(std::isfinite(o.color_jitter) && o.color_jitter >= 0.0,
              "ImageFolderSource: color_jitter must be finite and >= 0 (0: off), got ",
              o.color_jitter);
  TORCH_CHECK(o.reprob >= 0.0 && o.reprob <= 1.0,
              "ImageFolderSource: reprob must be in [0, 1], got ", o.reprob);
  TORCH_CHECK(o.max_image_pixels >= 1, "ImageFolderSource: max_image_pixels must be >= 1, got ",
              o.max_image_pixels);
  for (int c = 0; c < 3; ++c) {
    TORCH_CHECK(std::isfinite(o.mean[c]), "ImageFolderSource: mean[", c,
                "] must be finite, got ", o.mean[c]);
    TORCH_CHECK(std::isfinite(o.std[c]) && o.std[c] > 0.0f, "ImageFolderSource: std[", c,
                "] must be finite and > 0, got ", o.std[c]);
  }
}

}  // namespace

int64_t default_val_resize(int64_t image_size) {
  return static_cast<int64_t>(std::floor(static_cast<double>(image_size) / 0.875));
}

ImageFolderSource::ImageFolderSource(FileList files, ImageTransformOptions options)
    : files_(std::move(files)), options_(std::move(options)) {
  TORCH_CHECK(files_.labels.size() == files_.paths.size(), "ImageFolderSource: ",
              files_.paths.size(), " files but ", files_.labels.size(), " labels");
  check_options(options_);
  if (options_.val_resize == 0) options_.val_resize = default_val_resize(options_.image_size);
}

std::array<int64_t, 3> ImageFolderSource::sample_shape() const {
  return {3, options_.image_size, options_.image_size};
}

int64_t ImageFolderSource::label(int64_t index) const {
  return files_.labels[static_cast<size_t>(index)];
}

bool ImageFolderSource::write_timed(int64_t index, uint64_t seed, int64_t epoch, float* out,
                                    std::string& error, StageTimes* times) const {
  StageClock clock(times);
  Image image;
  // Only reading and decoding are data errors (a damaged file, or one claiming more pixels than
  // max_image_pixels); the transforms' checks are not.
  try {
    image = read_image(files_.paths[static_cast<size_t>(index)], options_.max_image_pixels);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
    return false;
  }
  clock.mark(&StageTimes::read_decode);
  if (options_.training) {
    Rng rng(kImageStream, seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index));
    train_transform(std::move(image), rng, out, times);
  } else {
    val_transform(image, out);
    clock.mark(&StageTimes::crop);
  }
  if (times) ++times->samples;
  return true;
}

// The draws follow the order of the steps, each step drawing only when it is on, so a sample's
// result is a function of (seed, epoch, index) and the options.
void ImageFolderSource::train_transform(Image image, Rng& rng, float* out,
                                        StageTimes* times) const {
  const auto& o = options_;
  StageClock clock(times);
  image = random_resized_crop(image, o.image_size, rng, o.scale, o.ratio, o.interpolation);
  clock.mark(&StageTimes::crop);
  if (o.hflip > 0.0 && rng.bernoulli(o.hflip)) horizontal_flip(image);
  if (o.rand_augment) rand_augment(image, rng, *o.rand_augment);
  clock.mark(&StageTimes::flip_rand_augment);
  if (o.color_jitter > 0.0) color_jitter(image, rng, o.color_jitter, o.color_jitter, o.color_jitter);
  clock.mark(&StageTimes::color_jitter);
  normalize_into(image, o.mean, o.std, out);
  if (o.reprob > 0.0) {
    RandomErasingOptions erasing;
    erasing.probability = o.reprob;
    random_erasing(out, 3, o.image_size, o.image_size, rng, erasing);
  }
  clock.mark(&StageTimes::normalize_erase);
}

void ImageFolderSource::val_transform(const Image& image, float* out) const {
  const auto& o = options_;
  const Image resized = resize_shorter(image, o.val_resize, Interpolation::Bicubic);
  normalize_into(center_crop(resized, o.image_size, o.image_size), o.mean, o.std, out);
}

}  // namespace convnn::data
