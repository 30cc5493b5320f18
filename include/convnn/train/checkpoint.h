#pragma once
// Checkpoints: the model, the optimiser, the position in training (epoch, next batch, optimiser
// step), the partial-epoch accumulators, the RNG state and the run's config, in one file written
// atomically (temporary file in the same directory, synced, then renamed), so a crash or a power
// cut never leaves a truncated checkpoint in place of a finished one.
//
// Format 2 stores a CRC-32 of the header, of every model tensor, of the optimiser state and of the
// RNG state, because torch's zip reader does not check the archive's own CRCs: a flipped byte in
// a tensor would otherwise load as a wrong weight. Format 1 (no checksums) is still read.
//
// Every tensor is stored on the CPU, whatever device trained the model, and loaded onto the device
// of the model it is loaded into: a checkpoint written on one device resumes on another.
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

/// Writes `path` atomically (write_file_atomically), the model's tensors and the optimiser's state
/// copied to the CPU (the live state stays where it is). Also removes the stale temporary files of
/// the other checkpoints in its folder (`.<name>.pt.tmp<pid>` of dead processes), so that one left
/// by a kill while checkpoint-best.pt was written does not wait for the next best epoch.
void save_checkpoint(const std::string& path, const TrainConfig& config,
                     const TrainingPosition& position, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer);

/// Reads only the config and the position (to build the model and the optimiser first).
Checkpoint read_checkpoint_header(const std::string& path);

/// Loads the weights (and, when `optimizer` is not null, the optimiser state and the RNG state)
/// into objects built from the checkpoint's config: the weights onto the model's device, each
/// parameter's optimiser state onto that parameter's device. Every check runs before anything is
/// changed; each failure is a c10::Error naming the path and the first offending record:
/// - a record's checksum does not match (the file was damaged after it was written);
/// - the tensors do not match the model (first mismatching parameter);
/// - a model tensor (or, when loading it, an optimiser state tensor) holds NaN or Inf, unless
///   `allow_non_finite` (a diverged run's weights evaluate to chance with a NaN loss).
void load_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer, bool allow_non_finite = false);

/// `dir`/checkpoint-latest.pt and `dir`/checkpoint-best.pt.
std::string latest_checkpoint_path(const std::string& run_dir);
std::string best_checkpoint_path(const std::string& run_dir);

/// Writes `contents` to `path` through the temporary file `.<name>.tmp<pid>` beside it, synced
/// before the rename, and syncs the folder after it. The temporary file is removed on any
/// failure; those of this target left by processes that no longer exist (killed mid-write) are
/// removed first, those of live processes (writes in progress) are kept.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace convnn::train
