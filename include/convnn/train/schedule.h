#pragma once
// Learning rate per optimiser step: linear warm-up from warmup_lr to lr, then cosine annealing to
// min_lr at the last step (or constant lr). Stepped per iteration, as timm does with
// t_in_epochs=False.
#include <cstdint>

#include "convnn/config/train_config.h"

namespace convnn::train {

class LrSchedule {
 public:
  LrSchedule(Schedule kind, double lr, double warmup_lr, double min_lr, int64_t warmup_steps,
             int64_t total_steps);
  /// From a config and the optimiser steps of one epoch.
  static LrSchedule from_config(const OptimizationConfig& config, int64_t steps_per_epoch);

  /// The rate of step `step` (0-based); steps past the end keep min_lr.
  double at(int64_t step) const;
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  Schedule kind_;
  double lr_, warmup_lr_, min_lr_;
  int64_t warmup_steps_, total_steps_;
};

}  // namespace convnn::train
