#pragma once
// A training config's data: its splits (subsets applied), the loaders (sharded in a data-parallel
// run) and their transforms, and the config resolved against the data.
#include <c10/core/Device.h>

#include <functional>
#include <string>
#include <vector>

#include "convnn/data/image_folder_source.h"
#include "convnn/data/loader.h"
#include "convnn/train/config.h"

namespace convnn::dist {
class ProcessGroup;
}

namespace convnn::train {

/// One split of a config's data before it becomes a loader: an in-memory set, or the file list
/// of an image folder.
struct SplitData {
  bool image_folder = false;
  data::ImageSet set;    // fashion-mnist, mnist, cifar10, cifar100
  data::FileList files;  // imagefolder

  int64_t size() const { return image_folder ? files.size() : set.size(); }
  const std::vector<std::string>& class_names() const {
    return image_folder ? files.class_names : set.class_names;
  }
  int64_t num_classes() const { return static_cast<int64_t>(class_names().size()); }
};

/// apply_recipe, then the data set's in_channels, image_size and num_classes written into
/// config.model_config and the crop padding of the in-memory sets resolved.
TrainConfig resolve_config(TrainConfig config, const SplitData& train_data);

/// The loader options of a config: shuffled and augmented (MixUp / CutMix when on) for
/// training, plain for evaluation; the in-memory sets normalised with their statistics.
data::LoaderOptions loader_options(const TrainConfig& config, bool training);
/// The per-sample transforms of an image folder (the resolved config's recipe values).
data::ImageTransformOptions image_transform_options(const TrainConfig& config, bool training);

/// The training or validation data of a config (subsets applied); Split::Test is the validation
/// folder of an imagefolder root.
SplitData load_split(const TrainConfig& config, data::Split split);
/// A loader of `data` with the config's options and transforms (training: augmented), for a model
/// on `device`: its batches are pinned when that is a CUDA device.
/// With `group`, the loader of this rank's shard (training: padded to equal shards).
/// `on_skipped` is told why each unreadable sample was left out (LoaderOptions::on_skipped).
data::DataLoader make_loader(SplitData data, const TrainConfig& config, bool training,
                             const c10::Device& device = c10::Device(c10::kCPU),
                             dist::ProcessGroup* group = nullptr,
                             std::function<void(const std::string&)> on_skipped = {});

}  // namespace convnn::train
