// A training config's data: the data library's splits and loaders with the run's settings, and
// the config resolved against the data (classes, channels, size).
#include "convnn/train/data_setup.h"

#include <utility>

#include "convnn/dist/process_group.h"

namespace convnn::train {

SplitData load_split(const TrainConfig& c, data::Split split) {
  return data::load_split(c.data, split, c.run.seed);
}

data::LoaderSetup loader_setup(const TrainConfig& c, bool training, const c10::Device& device,
                               dist::ProcessGroup* group,
                               std::function<void(const std::string&)> on_skipped) {
  data::LoaderSetup setup;
  setup.training = training;
  setup.batch_size = c.optimization.batch_size;
  setup.seed = c.run.seed;
  setup.label_smoothing = c.optimization.smoothing;
  setup.pin_memory = device.is_cuda();
  if (group != nullptr) {
    setup.shard_rank = group->rank();
    setup.shard_count = group->world_size();
  }
  setup.on_skipped = std::move(on_skipped);
  if (models::model_entry(c.model).family == models::ModelFamily::LanguageModel) {
    setup.context = models::language_model_options(c.model, c.model_config).context();
  }
  return setup;
}

std::unique_ptr<data::BatchStream> make_batches(SplitData data, const TrainConfig& c, bool training,
                                               const c10::Device& device, dist::ProcessGroup* group,
                                               std::function<void(const std::string&)> on_skipped) {
  return data::make_batches(std::move(data), c.data, c.augmentation,
                            loader_setup(c, training, device, group, std::move(on_skipped)));
}

data::DataLoader make_loader(SplitData data, const TrainConfig& c, bool training, const c10::Device& device,
                             dist::ProcessGroup* group, std::function<void(const std::string&)> on_skipped) {
  return data::make_loader(std::move(data), c.data, c.augmentation,
                           loader_setup(c, training, device, group, std::move(on_skipped)));
}

TrainConfig resolve_config(TrainConfig c, const SplitData& train_data) {
  c = apply_recipe(std::move(c));
  c.model_config.num_classes = train_data.num_classes();
  if (train_data.text) return c;
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
