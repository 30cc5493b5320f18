#pragma once
// What the DataLoader batches: a source of labelled samples, each written as a float32 CHW image
// on demand. The loader owns the order, the threads and the batch-level steps (MixUp / CutMix);
// a source owns reading and per-sample transforms. Two sources exist: an in-memory ImageSet
// (crop with padding, flip; below) and image files on disk (image_folder_source.h).
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "convnn/data/datasets.h"

namespace convnn::data {

class SampleSource {
 public:
  virtual ~SampleSource() = default;

  virtual int64_t size() const = 0;
  /// (channels, height, width) of every sample written.
  virtual std::array<int64_t, 3> sample_shape() const = 0;
  virtual const std::vector<std::string>& class_names() const = 0;
  virtual int64_t label(int64_t index) const = 0;

  /// Writes sample `index` as float32 CHW (sample_shape) to `out`, transformed for `epoch`.
  /// Every random choice comes from an Rng keyed by (stream, seed, epoch, index), so the result
  /// depends on nothing else (not on the thread, not on the other samples). Returns false, with
  /// the reason (naming the file) in `error`, when the sample's data cannot be read or decoded:
  /// the loader then skips it or, in strict mode, stops. Other problems throw.
  virtual bool write(int64_t index, uint64_t seed, int64_t epoch, float* out,
                     std::string& error) const = 0;

  int64_t num_classes() const { return static_cast<int64_t>(class_names().size()); }
  int64_t sample_numel() const {
    const auto s = sample_shape();
    return s[0] * s[1] * s[2];
  }
};

/// The in-memory sets' transforms (Fashion-MNIST, MNIST, CIFAR): a random crop of the original
/// size from the image zero-padded by `crop_padding` pixels, a horizontal flip with probability
/// `hflip`, then (x / 255 - mean[c]) / std[c] (no normalisation when mean and std are empty).
struct ImageSetTransform {
  int64_t crop_padding = 0;
  double hflip = 0.0;
  std::vector<double> mean, std;
};

/// A source over uint8 [N,C,H,W] images held in memory. Checks the set and the transform
/// (c10::Error naming the value and the rule, prefixed "DataLoader:" as the loader builds it).
std::shared_ptr<const SampleSource> image_set_source(ImageSet set, ImageSetTransform transform);

}  // namespace convnn::data
