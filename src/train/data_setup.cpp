// A training config's data: the split's samples (subsets applied), the loader and its per-sample
// transforms, and the config resolved against the data (classes, channels, size).
#include "convnn/train/data_setup.h"

#include <algorithm>
#include <limits>

#include "convnn/data/subset.h"
#include "convnn/dist/process_group.h"

namespace convnn::train {

data::LoaderOptions loader_options(const TrainConfig& c, bool training) {
  const auto& a = c.augmentation;
  data::LoaderOptions o;
  o.batch_size = c.optimization.batch_size;
  o.shuffle = training;
  o.seed = c.run.seed;
  o.workers = c.data.workers;
  o.prefetch = c.data.prefetch;
  o.strict = c.data.strict_data;
  if (!is_image_folder(c)) {
    const auto norm = data::normalisation_of(data::parse_dataset(c.data.dataset));
    o.crop_padding = training ? a.crop_padding.value_or(0) : 0;
    o.hflip = training ? a.hflip.value_or(0.0) : 0.0;
    o.mean = norm.mean;
    o.std = norm.std;
  }
  const double mixup = a.mixup.value_or(0.0), cutmix = a.cutmix.value_or(0.0);
  if (training && (mixup > 0.0 || cutmix > 0.0)) {
    data::MixupOptions options;
    options.mixup_alpha = mixup;
    options.cutmix_alpha = cutmix;
    options.switch_probability = a.mixup_switch_prob;
    options.label_smoothing = c.optimization.smoothing;
    o.mixup = options;
  }
  return o;
}

data::ImageTransformOptions image_transform_options(const TrainConfig& c, bool training) {
  const auto resolved = apply_recipe(c);  // a no-op on a resolved config
  const auto& a = resolved.augmentation;
  data::ImageTransformOptions o;
  o.training = training;
  o.image_size = *resolved.data.image_size;
  o.val_resize = *resolved.data.val_resize;
  o.scale = {a.scale_min, a.scale_max};
  o.ratio = {a.ratio_min, a.ratio_max};
  o.hflip = *a.hflip;
  if (*a.rand_augment > 0.0 && a.rand_augment_ops > 0) {
    data::RandAugmentOptions ra;
    ra.magnitude = *a.rand_augment;
    ra.num_ops = a.rand_augment_ops;
    // timm's rule: a standard deviation above 100 means uniform in [0, M].
    ra.magnitude_std =
        a.rand_augment_mstd > 100.0 ? std::numeric_limits<double>::infinity() : a.rand_augment_mstd;
    o.rand_augment = ra;
  }
  o.color_jitter = *a.color_jitter;
  o.reprob = *a.reprob;
  return o;
}

SplitData load_split(const TrainConfig& c, data::Split split) {
  const bool train = split == data::Split::Train;
  const auto& d = c.data;
  const int64_t n = train ? d.train_subset : d.val_subset;
  SplitData data;
  data.image_folder = is_image_folder(c);
  if (data.image_folder) {
    data.files = data::subset(data::load_image_folder_split(d.data_dir, train, d.val_labels), n, c.run.seed);
    return data;
  }
  const auto kind = data::parse_dataset(d.dataset);
  const auto root = d.data_dir.empty() ? data::default_data_dir(kind) : d.data_dir;
  data.set = data::subset(data::load_dataset(kind, root, split), n, c.run.seed);
  return data;
}

data::DataLoader make_loader(SplitData data, const TrainConfig& c, bool training, const c10::Device& device,
                             dist::ProcessGroup* group, std::function<void(const std::string&)> on_skipped) {
  auto options = loader_options(c, training);
  options.pin_memory = device.is_cuda();
  options.on_skipped = std::move(on_skipped);
  if (group != nullptr) {
    options.shard_rank = group->rank();
    options.shard_count = group->world_size();
    options.pad_shards = training;  // evaluation counts every sample once
  }
  if (!data.image_folder) return data::DataLoader(std::move(data.set), options);
  return data::DataLoader(std::make_shared<data::ImageFolderSource>(
                              std::move(data.files), image_transform_options(c, training)),
                          options);
}

TrainConfig resolve_config(TrainConfig c, const SplitData& train_data) {
  c = apply_recipe(std::move(c));
  c.model_config.num_classes = train_data.num_classes();
  if (train_data.image_folder) {
    c.model_config.in_channels = 3;  // decoded to RGB
    c.model_config.image_size = *c.data.image_size;
    return c;
  }
  const auto& set = train_data.set;
  TORCH_CHECK(set.height() == set.width(), "the models take square images; ", c.data.dataset, " has ",
              set.height(), "x", set.width());
  c.model_config.in_channels = set.channels();
  c.model_config.image_size = set.height();
  if (!c.augmentation.crop_padding) c.augmentation.crop_padding = set.height() >= 32 ? 4 : 2;
  return c;
}

}  // namespace convnn::train
