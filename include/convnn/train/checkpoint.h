#pragma once
// Checkpoints: the model, the optimiser, the position in training (epoch, next batch, optimiser
// step), the partial-epoch accumulators, the RNG state and the run's config, in one file written
// atomically (temporary file in the same directory, then rename), so a crash never leaves a
// truncated checkpoint in place of a finished one.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>

#include "convnn/train/config.h"

namespace convnn::train {

struct TrainingPosition {
  int64_t epoch = 0;        // epoch in progress (0-based)
  int64_t next_batch = 0;   // first batch of `epoch` not yet trained; 0 at an epoch boundary
  int64_t step = 0;         // optimiser steps done
  double best_top1 = -1.0;  // best validation top-1 so far (percent); -1: none yet
  int64_t best_epoch = -1;
  // Accumulators of the epoch in progress, so that a resumed epoch reports what an
  // uninterrupted one would.
  double loss_sum = 0.0;
  int64_t samples = 0;
  int64_t correct = 0;
  double seconds = 0.0;
  int64_t skipped = 0;  // unreadable training files left out so far in this epoch
};

struct Checkpoint {
  TrainConfig config;
  TrainingPosition position;
};

/// Writes `path` atomically.
void save_checkpoint(const std::string& path, const TrainConfig& config,
                     const TrainingPosition& position, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer);

/// Reads only the config and the position (to build the model and the optimiser first).
Checkpoint read_checkpoint_header(const std::string& path);

/// Loads the weights (and, when `optimizer` is not null, the optimiser state and the RNG state)
/// into objects built from the checkpoint's config. A checkpoint whose tensors do not match the
/// model raises a c10::Error naming the path and the first mismatching parameter.
void load_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer);

/// `dir`/checkpoint-latest.pt and `dir`/checkpoint-best.pt.
std::string latest_checkpoint_path(const std::string& run_dir);
std::string best_checkpoint_path(const std::string& run_dir);

/// Writes `contents` to `path` through a temporary file and a rename.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace convnn::train
