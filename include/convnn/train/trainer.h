#pragma once
// The training loop and evaluation behind `convnn train`, `convnn eval` and `convnn compare`.
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "convnn/data/loader.h"
#include "convnn/models/registry.h"
#include "convnn/train/config.h"
#include "convnn/train/metrics.h"

namespace convnn::train {

struct Evaluation {
  double loss = 0.0;  // cross-entropy without smoothing
  double top1 = 0.0;  // percent
  double top5 = 0.0;  // percent
  int64_t samples = 0;
  std::vector<std::vector<int64_t>> confusion;  // [true][predicted]
};

/// Runs `model` in eval mode over one pass of `loader`.
Evaluation evaluate(models::Model& model, data::DataLoader& loader, Precision precision);

struct TrainResult {
  std::string run_dir;
  std::vector<EpochMetrics> epochs;
  Evaluation final_eval;          // of the last epoch's model on the validation set
  double best_top1 = 0.0;
  int64_t best_epoch = 0;         // 1-based
  int64_t parameters = 0;
  int64_t macs = 0;               // per image
  bool interrupted = false;       // stopped by `stop` (SIGINT); checkpoint-latest.pt holds the position
};

struct TrainHooks {
  /// Checked after every optimiser step; when set, training saves checkpoint-latest.pt and returns.
  const std::atomic<bool>* stop = nullptr;
  /// Called with the loss of every trained batch (tests observe the trajectory).
  std::function<void(int64_t step, double loss)> on_batch;
  /// Stop after this many optimiser steps in this call, as if interrupted (tests); 0: never.
  int64_t max_steps = 0;
};

/// The data set's in_channels, image_size and num_classes written into config.model_config, and
/// the -1 data defaults resolved.
TrainConfig resolve_config(TrainConfig config, const data::ImageSet& train_set);

/// Trains as `config` says, in `run_dir`; with `resume`, continues from that checkpoint file (its
/// run directory is reused). Prints progress to stdout unless config.quiet.
TrainResult train(const TrainConfig& config, const std::string& resume = "",
                  const TrainHooks& hooks = {});

/// The loader options of a config: shuffled and augmented for training, plain for evaluation;
/// both normalised with the data set's statistics.
data::LoaderOptions loader_options(const TrainConfig& config, bool training);

/// The training and validation sets of a config (subsets applied).
data::ImageSet load_split(const TrainConfig& config, data::Split split);

}  // namespace convnn::train
