#pragma once
// A training config's data, through the data library (data/config_loader.h): its splits, its
// loaders with the run's batch, seed, smoothing and shard, and the config resolved against the
// data (classes, channels, size).
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>

#include "convnn/data/config_loader.h"
#include "convnn/config/train_config.h"

namespace convnn::dist {
class ProcessGroup;
}

namespace convnn::train {

using data::SplitData;

/// apply_recipe, then the data set's in_channels, image_size and num_classes (a text set: its
/// vocabulary) written into config.model_config and the crop padding of the in-memory sets resolved.
TrainConfig resolve_config(TrainConfig config, const SplitData& train_data);

/// data::load_split with the run's seed.
SplitData load_split(const TrainConfig& config, data::Split split);

/// The loader setup of a run: its batch size, seed and label smoothing, pinned batches for a
/// model on a CUDA `device`, with `group` this rank's shard, `on_skipped`, and for a language
/// model its context (the tokens of a window).
data::LoaderSetup loader_setup(const TrainConfig& config, bool training,
                               const c10::Device& device = c10::Device(c10::kCPU),
                               dist::ProcessGroup* group = nullptr,
                               std::function<void(const std::string&)> on_skipped = {});

/// data::make_batches with the config's sections and loader_setup: a DataLoader for images, a
/// TokenLoader of windows of the language model's context for text.
std::unique_ptr<data::BatchStream> make_batches(SplitData data, const TrainConfig& config, bool training,
                                               const c10::Device& device = c10::Device(c10::kCPU),
                                               dist::ProcessGroup* group = nullptr,
                                               std::function<void(const std::string&)> on_skipped = {});

/// data::make_loader with the config's sections and loader_setup (image data only).
data::DataLoader make_loader(SplitData data, const TrainConfig& config, bool training,
                             const c10::Device& device = c10::Device(c10::kCPU),
                             dist::ProcessGroup* group = nullptr,
                             std::function<void(const std::string&)> on_skipped = {});

}  // namespace convnn::train
