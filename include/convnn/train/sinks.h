#pragma once
// What a training run reports as it goes, to the sinks its caller installs (TrainHooks::sinks):
// a console progress display, plots, a logger, a test's recorder. The library prints nothing and
// starts no program; `convnn train` installs its console and plot sinks (apps/convnn/sinks.cpp).
// In a data-parallel run only rank 0 calls its sinks, with the metrics of all ranks (but for
// sample_skipped).
#include <cstdint>
#include <string>

#include "convnn/train/metrics.h"

namespace convnn::train {

struct Evaluation;

class TrainingSink {
 public:
  virtual ~TrainingSink() = default;
  /// The run begins (or resumes) in `run_dir`.
  virtual void run_started(const std::string& run_dir) {}
  /// Epoch `epoch` (1-based) of `epochs` begins at batch `first_batch` (0-based; > 0 on resume)
  /// of its `batches`.
  virtual void epoch_started(int64_t epoch, int64_t epochs, int64_t batches, int64_t first_batch) {}
  /// After batch `batch` (0-based): `images` trained in this call so far, the epoch's mean loss
  /// so far and the learning rate (of this process, in a data-parallel run).
  virtual void batch_done(int64_t batch, int64_t images, double mean_loss, double lr) {}
  /// The loss of the batch just trained, with the optimiser steps done so far (of this process;
  /// tests observe the trajectory through it).
  virtual void batch_loss(int64_t step, double loss) {}
  /// A sample that could not be read was skipped, for `reason` (which names its file). Unlike the
  /// other events, told on every rank: each reads the files of its own shard.
  virtual void sample_skipped(const std::string& reason) {}
  /// The epoch's training ended (before its evaluation), or was stopped.
  virtual void epoch_trained() {}
  /// The epoch's metrics (metrics.json already holds them) and its evaluation, after the
  /// checkpoints are written.
  virtual void epoch_done(const EpochMetrics& metrics, const Evaluation& evaluation, int64_t epochs) {}
  /// Training stopped at the request of TrainHooks::stop after batch `batch` (1-based) of epoch
  /// `epoch` (1-based); `checkpoint` holds the position.
  virtual void stopped(int64_t epoch, int64_t batch, const std::string& checkpoint) {}
};

}  // namespace convnn::train
