#include "convnn/train/schedule.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace convnn::train {

LrSchedule::LrSchedule(Schedule kind, double lr, double warmup_lr, double min_lr,
                       int64_t warmup_steps, int64_t total_steps)
    : kind_(kind), lr_(lr), warmup_lr_(warmup_lr), min_lr_(min_lr),
      warmup_steps_(warmup_steps), total_steps_(total_steps) {
  TORCH_CHECK(total_steps >= 1, "LrSchedule: total_steps must be >= 1, got ", total_steps);
  TORCH_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps,
              "LrSchedule: warmup_steps must be in [0, total_steps = ", total_steps, "], got ",
              warmup_steps);
}

LrSchedule LrSchedule::from_config(const OptimizationConfig& c, int64_t steps_per_epoch) {
  const int64_t total = c.epochs * steps_per_epoch;
  const auto warmup = std::min(total, static_cast<int64_t>(std::llround(c.warmup_epochs * steps_per_epoch)));
  return LrSchedule(c.schedule, c.lr, c.warmup_lr, c.min_lr, warmup, total);
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps_) {
    return warmup_lr_ + (lr_ - warmup_lr_) * static_cast<double>(step) / warmup_steps_;
  }
  if (kind_ == Schedule::Constant) return lr_;
  // Cosine from lr at the end of the warm-up to min_lr at the last step.
  const int64_t span = std::max<int64_t>(1, total_steps_ - 1 - warmup_steps_);
  const double t = std::min(1.0, static_cast<double>(step - warmup_steps_) / span);
  return min_lr_ + 0.5 * (lr_ - min_lr_) * (1.0 + std::cos(M_PI * t));
}

}  // namespace convnn::train
