// A training config's data: the split's samples (subsets applied), the loader and its per-sample
// transforms, and the config resolved against the data (classes, channels, size).
#include "convnn/train/data_setup.h"

#include <algorithm>
#include <limits>

#include "convnn/data/subset.h"
#include "convnn/dist/process_group.h"

namespace convnn::train {

data::LoaderOptions loader_options(const TrainConfig& c, bool training) {
  data::LoaderOptions o;
  o.batch_size = c.batch_size;
  o.shuffle = training;
  o.seed = c.seed;
  o.workers = c.workers;
  o.prefetch = c.prefetch;
  o.strict = c.strict_data;
  if (!is_image_folder(c)) {
    const auto norm = data::normalisation_of(data::parse_dataset(c.dataset));
    o.crop_padding = training ? std::max<int64_t>(0, c.crop_padding) : 0;
    o.hflip = training ? std::max(0.0, c.hflip) : 0.0;
    o.mean = norm.mean;
    o.std = norm.std;
  }
  if (training && (c.mixup > 0.0 || c.cutmix > 0.0)) {
    data::MixupOptions mixup;
    mixup.mixup_alpha = std::max(0.0, c.mixup);
    mixup.cutmix_alpha = std::max(0.0, c.cutmix);
    mixup.switch_probability = c.mixup_switch_prob;
    mixup.label_smoothing = c.smoothing;
    o.mixup = mixup;
  }
  return o;
}

data::ImageTransformOptions image_transform_options(const TrainConfig& c, bool training) {
  const auto resolved = apply_recipe(c);  // a no-op on a resolved config
  data::ImageTransformOptions o;
  o.training = training;
  o.image_size = resolved.image_size;
  o.val_resize = resolved.val_resize;
  o.scale = {c.scale_min, c.scale_max};
  o.ratio = {c.ratio_min, c.ratio_max};
  o.hflip = resolved.hflip;
  if (resolved.rand_augment > 0.0 && c.rand_augment_ops > 0) {
    data::RandAugmentOptions ra;
    ra.magnitude = resolved.rand_augment;
    ra.num_ops = c.rand_augment_ops;
    // timm's rule: a standard deviation above 100 means uniform in [0, M].
    ra.magnitude_std = c.rand_augment_mstd > 100.0 ? std::numeric_limits<double>::infinity()
                                                   : c.rand_augment_mstd;
    o.rand_augment = ra;
  }
  o.color_jitter = resolved.color_jitter;
  o.reprob = resolved.reprob;
  return o;
}

SplitData load_split(const TrainConfig& c, data::Split split) {
  const bool train = split == data::Split::Train;
  const int64_t n = train ? c.train_subset : c.val_subset;
  SplitData data;
  data.image_folder = is_image_folder(c);
  if (data.image_folder) {
    data.files = data::subset(data::load_image_folder_split(c.data_dir, train, c.val_labels), n, c.seed);
    return data;
  }
  const auto kind = data::parse_dataset(c.dataset);
  const auto root = c.data_dir.empty() ? data::default_data_dir(kind) : c.data_dir;
  data.set = data::subset(data::load_dataset(kind, root, split), n, c.seed);
  return data;
}

data::DataLoader make_loader(SplitData data, const TrainConfig& c, bool training,
                             const c10::Device& device, dist::ProcessGroup* group) {
  auto options = loader_options(c, training);
  options.pin_memory = device.is_cuda();
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
    c.model_config.image_size = c.image_size;
    return c;
  }
  const auto& set = train_data.set;
  TORCH_CHECK(set.height() == set.width(), "the models take square images; ", c.dataset, " has ",
              set.height(), "x", set.width());
  c.model_config.in_channels = set.channels();
  c.model_config.image_size = set.height();
  if (c.crop_padding < 0) c.crop_padding = set.height() >= 32 ? 4 : 2;
  return c;
}

}  // namespace convnn::train
