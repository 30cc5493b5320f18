#pragma once
// Per-epoch metrics of a run, kept as metrics.csv and metrics.json in the run directory (both
// rewritten atomically after every epoch). Plots are the command's (apps/convnn/plots.cpp).
#include <string>
#include <vector>

namespace convnn::train {

struct EpochMetrics {
  int64_t epoch = 0;          // 1-based
  double train_loss = 0.0;
  double train_top1 = 0.0;    // percent, on the augmented training batches (a language model: next-token)
  double val_loss = 0.0;
  double val_top1 = 0.0;      // percent
  double val_top5 = 0.0;      // percent
  double lr = 0.0;            // at the end of the epoch
  double images_per_s = 0.0;  // training samples per second: images, or a language model's tokens
  double epoch_time_s = 0.0;  // training time of the epoch (without evaluation)
  int64_t skipped = 0;        // training samples left out: unreadable image files
};

class MetricsLog {
 public:
  /// Reads `run_dir`/metrics.json when it exists (resume), keeping epochs before `first_epoch`.
  MetricsLog(std::string run_dir, int64_t first_epoch);
  void add(const EpochMetrics& metrics);
  const std::vector<EpochMetrics>& epochs() const { return epochs_; }

 private:
  void write() const;
  std::string run_dir_;
  std::vector<EpochMetrics> epochs_;
};

/// Column names of metrics.csv, in order.
const std::vector<std::string>& metrics_columns();

/// confusion.csv (rows: true class, columns: predicted, with the class names) and confusion.dat
/// (the bare matrix, which `convnn eval` plots).
void write_confusion(const std::string& dir, const std::vector<std::string>& class_names,
                     const std::vector<std::vector<int64_t>>& counts);

}  // namespace convnn::train
