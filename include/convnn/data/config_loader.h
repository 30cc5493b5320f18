#pragma once
// From a data config to batches: a split's samples (subsets applied), then a loader with the
// config's transforms, sharded for data parallelism.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "convnn/data/config.h"
#include "convnn/data/datasets.h"
#include "convnn/data/image_folder_source.h"
#include "convnn/data/loader.h"
#include "convnn/data/text.h"

namespace convnn::data {

/// One split of a config's data before it becomes a loader: an in-memory set, the file list of an
/// image folder, or the byte tokens of a text set.
struct SplitData {
  bool image_folder = false;
  bool text = false;
  ImageSet set;       // fashion-mnist, mnist, cifar10, cifar100
  FileList files;     // imagefolder
  at::Tensor tokens;  // fortunes: uint8 [L]

  /// Images, files, or tokens.
  int64_t size() const { return image_folder ? files.size() : text ? tokens.numel() : set.size(); }
  const std::vector<std::string>& class_names() const {
    return image_folder ? files.class_names : text ? byte_names() : set.class_names;
  }
  int64_t num_classes() const { return static_cast<int64_t>(class_names().size()); }
};

/// The training or validation data of `config` (Split::Test is the validation folder of an
/// imagefolder root, the held-out documents of a text set), with an image set's train_subset /
/// val_subset drawn from a shuffle seeded by `seed` (a text set's subsets count windows: its loader
/// takes them).
SplitData load_split(const DataConfig& config, Split split, uint64_t seed);

/// What a loader takes besides the data and augmentation sections.
struct LoaderSetup {
  bool training = false;  // shuffled and augmented (MixUp / CutMix when on); else in order, plain
  int64_t batch_size = 128;
  uint64_t seed = 0;
  double label_smoothing = 0.0;  // of the soft targets of MixUp / CutMix
  bool pin_memory = false;       // for a model on a CUDA device
  /// This process's shard of every epoch (LoaderOptions): training pads the shards to equal
  /// size, evaluation does not (no sample counted twice).
  int64_t shard_rank = 0, shard_count = 1;
  std::function<void(const std::string& reason)> on_skipped;  // LoaderOptions::on_skipped
  /// Text sets: the tokens of a window (the model's context).
  int64_t context = 0;
};

/// The loader options: the in-memory sets normalised with their statistics, cropped and flipped
/// in training.
LoaderOptions loader_options(const DataConfig& data, const AugmentationConfig& augmentation,
                             const LoaderSetup& setup);
/// The per-sample transforms of an image folder, with the recipe's values where unset.
ImageTransformOptions image_transform_options(const DataConfig& data, const AugmentationConfig& augmentation,
                                              bool training);
/// A loader of `split` with the options and transforms above (an image set or folder).
DataLoader make_loader(SplitData split, const DataConfig& data, const AugmentationConfig& augmentation,
                       LoaderSetup setup);
/// The batches of any split: make_loader's for images, a TokenLoader of windows of setup.context
/// tokens for text (train_subset / val_subset: windows per epoch).
std::unique_ptr<BatchStream> make_batches(SplitData split, const DataConfig& data,
                                          const AugmentationConfig& augmentation, LoaderSetup setup);

}  // namespace convnn::data
