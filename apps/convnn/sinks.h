#pragma once
// What `convnn train` and `convnn compare` show of a run: the console (a live progress bar or
// plain log lines, one line per epoch, where a stopped run resumes) and the PNG plots.
#include <memory>
#include <optional>
#include <string>

#include "convnn/train/sinks.h"
#include "progress.h"

namespace convnn::cli {

class ConsoleSink final : public train::TrainingSink {
 public:
  /// `quiet`: plain lines even on a terminal, every `log_interval` batches. `text`: a language
  /// model's run, whose samples are tokens and whose losses are also shown in bits per token.
  ConsoleSink(bool quiet, int64_t log_interval, bool text = false);
  void epoch_started(int64_t epoch, int64_t epochs, int64_t batches, int64_t first_batch) override;
  void batch_done(int64_t batch, int64_t images, double mean_loss, double lr) override;
  void epoch_trained() override;
  void epoch_done(const train::EpochMetrics& m, const train::Evaluation& evaluation, int64_t epochs) override;
  void stopped(int64_t epoch, int64_t batch, const std::string& checkpoint) override;
  void sample_skipped(const std::string& reason) override;

 private:
  bool live_;
  int64_t log_interval_;
  bool text_;
  std::optional<EpochProgress> progress_;
};

/// Redraws `run_dir`/plots after every epoch; says once when gnuplot is missing.
class PlotSink final : public train::TrainingSink {
 public:
  void run_started(const std::string& run_dir) override { run_dir_ = run_dir; }
  void epoch_done(const train::EpochMetrics&, const train::Evaluation&, int64_t) override;

 private:
  std::string run_dir_;
  bool warned_ = false;
};

/// The warning line on stderr for a sample a loader skipped (TrainingSink::sample_skipped,
/// LoaderOptions::on_skipped).
void print_skipped_sample(const std::string& reason);

}  // namespace convnn::cli
