// From a data config to batches: load_split, then the loader's options and transforms.
#include "convnn/data/config_loader.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include "convnn/data/subset.h"

namespace convnn::data {

SplitData load_split(const DataConfig& d, Split split, uint64_t seed) {
  const bool train = split == Split::Train;
  const int64_t n = train ? d.train_subset : d.val_subset;
  SplitData data;
  if (is_text_dataset(d.dataset)) {
    // The split's documents are the same for every seed (kTextSplitSeed); the subsets are windows.
    data.text = true;
    const auto dir = d.data_dir.empty() ? default_text_dir(d.dataset) : d.data_dir;
    auto splits = split_documents(read_fortune_documents(dir), kTextValidationFraction, kTextSplitSeed);
    data.tokens = train ? std::move(splits.train) : std::move(splits.validation);
    return data;
  }
  data.image_folder = is_image_folder(d);
  if (data.image_folder) {
    data.files = subset(load_image_folder_split(d.data_dir, train, d.val_labels), n, seed);
    return data;
  }
  const auto kind = parse_dataset(d.dataset);
  const auto root = d.data_dir.empty() ? default_data_dir(kind) : d.data_dir;
  data.set = subset(load_dataset(kind, root, split), n, seed);
  return data;
}

LoaderOptions loader_options(const DataConfig& d, const AugmentationConfig& a, const LoaderSetup& setup) {
  LoaderOptions o;
  o.batch_size = setup.batch_size;
  o.shuffle = setup.training;
  o.seed = setup.seed;
  o.workers = d.workers;
  o.prefetch = d.prefetch;
  o.strict = d.strict_data;
  o.pin_memory = setup.pin_memory;
  o.shard_rank = setup.shard_rank;
  o.shard_count = setup.shard_count;
  o.pad_shards = setup.training;
  o.on_skipped = setup.on_skipped;
  if (!is_image_folder(d) && !is_text_dataset(d.dataset)) {
    const auto norm = normalisation_of(parse_dataset(d.dataset));
    o.crop_padding = setup.training ? a.crop_padding.value_or(0) : 0;
    o.hflip = setup.training ? a.hflip.value_or(0.0) : 0.0;
    o.mean = norm.mean;
    o.std = norm.std;
  }
  const double mixup = a.mixup.value_or(0.0), cutmix = a.cutmix.value_or(0.0);
  if (setup.training && (mixup > 0.0 || cutmix > 0.0)) {
    MixupOptions options;
    options.mixup_alpha = mixup;
    options.cutmix_alpha = cutmix;
    options.switch_probability = a.mixup_switch_prob;
    options.label_smoothing = setup.label_smoothing;
    o.mixup = options;
  }
  return o;
}

ImageTransformOptions image_transform_options(const DataConfig& data, const AugmentationConfig& augmentation,
                                              bool training) {
  auto d = data;
  auto a = augmentation;
  apply_recipe(d, a);  // a no-op on a resolved config
  ImageTransformOptions o;
  o.training = training;
  o.image_size = *d.image_size;
  o.val_resize = *d.val_resize;
  o.scale = {a.scale_min, a.scale_max};
  o.ratio = {a.ratio_min, a.ratio_max};
  o.hflip = *a.hflip;
  if (*a.rand_augment > 0.0 && a.rand_augment_ops > 0) {
    RandAugmentOptions ra;
    ra.magnitude = *a.rand_augment;
    ra.num_ops = a.rand_augment_ops;
    // timm's rule: a standard deviation above 100 means uniform in [0, M].
    ra.magnitude_std =
        a.rand_augment_mstd > 100.0 ? std::numeric_limits<double>::infinity() : a.rand_augment_mstd;
    o.rand_augment = ra;
  }
  o.color_jitter = *a.color_jitter;
  o.reprob = *a.reprob;
  o.max_image_pixels = d.max_image_pixels;
  return o;
}

DataLoader make_loader(SplitData split, const DataConfig& data, const AugmentationConfig& augmentation,
                       LoaderSetup setup) {
  const bool training = setup.training;
  auto options = loader_options(data, augmentation, setup);
  if (!split.image_folder) return DataLoader(std::move(split.set), options);
  return DataLoader(std::make_shared<ImageFolderSource>(
                        std::move(split.files), image_transform_options(data, augmentation, training)),
                    options);
}

std::unique_ptr<BatchStream> make_batches(SplitData split, const DataConfig& data,
                                          const AugmentationConfig& augmentation, LoaderSetup setup) {
  if (!split.text) return std::make_unique<DataLoader>(make_loader(std::move(split), data, augmentation, setup));
  TokenLoaderOptions o;
  o.context = setup.context;
  o.batch_size = setup.batch_size;
  o.training = setup.training;
  o.seed = setup.seed;
  o.max_windows = setup.training ? data.train_subset : data.val_subset;
  o.shard_rank = setup.shard_rank;
  o.shard_count = setup.shard_count;
  return std::make_unique<TokenLoader>(std::move(split.tokens), o);
}

}  // namespace convnn::data
