#include "sinks.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>

#include "convnn/train/trainer.h"
#include "plots.h"

namespace convnn::cli {

ConsoleSink::ConsoleSink(bool quiet, int64_t log_interval, bool text)
    : live_(!quiet && stdout_is_terminal()), log_interval_(log_interval), text_(text) {}

void ConsoleSink::epoch_started(int64_t epoch, int64_t epochs, int64_t batches, int64_t first_batch) {
  progress_.emplace(fmt::format("epoch {}/{}", epoch, epochs), batches, first_batch, live_, log_interval_,
                    text_ ? "tok/s" : "img/s");
}

void ConsoleSink::batch_done(int64_t batch, int64_t images, double mean_loss, double lr) {
  if (progress_) progress_->update(batch, images, mean_loss, lr);
}

void ConsoleSink::epoch_trained() {
  if (progress_) progress_->finish();
  progress_.reset();
}

void ConsoleSink::epoch_done(const train::EpochMetrics& m, const train::Evaluation& evaluation, int64_t epochs) {
  const auto skipped = m.skipped == 0 && evaluation.skipped == 0
                           ? std::string()
                           : fmt::format("  skipped {} train / {} val unreadable files (see the warnings)",
                                         m.skipped, evaluation.skipped);
  const auto bits = text_ ? fmt::format(" ({:.3f} bits/token)", m.val_loss / std::log(2.0)) : std::string();
  fmt::print("epoch {}/{}  train loss {:.4f} top-1 {:.2f}%  val loss {:.4f}{} top-1 {:.2f}% top-5 {:.2f}%  "
             "lr {:.2e}  {:.0f} {}  {}{}\n",
             m.epoch, epochs, m.train_loss, m.train_top1, m.val_loss, bits, m.val_top1, m.val_top5, m.lr,
             m.images_per_s, text_ ? "tok/s" : "img/s", format_duration(m.epoch_time_s), skipped);
  std::fflush(stdout);
}

void ConsoleSink::stopped(int64_t epoch, int64_t batch, const std::string& checkpoint) {
  fmt::print("stopped at epoch {} batch {}; resume with --resume {}\n", epoch, batch, checkpoint);
  std::fflush(stdout);
}

void PlotSink::epoch_done(const train::EpochMetrics&, const train::Evaluation&, int64_t) {
  if (plot_metrics(run_dir_) || warned_) return;
  fmt::print("note: gnuplot is not installed; no plots drawn (metrics.csv has the numbers)\n");
  warned_ = true;
}

void ConsoleSink::sample_skipped(const std::string& reason) { print_skipped_sample(reason); }

void print_skipped_sample(const std::string& reason) {
  fmt::print(stderr, "convnn: warning: skipped a sample: {}\n", reason);
}

}  // namespace convnn::cli
