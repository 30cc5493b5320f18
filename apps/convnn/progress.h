#pragma once
// One epoch's progress on stdout: a live bar (ETA, samples/s, loss, lr) on a terminal, plain log
// lines every `log_interval` batches otherwise or with --quiet (none when it is 0).
#include <chrono>
#include <cstdint>
#include <string>

namespace convnn::cli {

class EpochProgress {
 public:
  /// `unit`: what a sample is, per second ("img/s", "tok/s").
  EpochProgress(std::string label, int64_t total_batches, int64_t first_batch, bool live,
                int64_t log_interval, std::string unit = "img/s");
  /// After batch `batch` (0-based): `images` (samples) trained in this call so far, running mean loss.
  void update(int64_t batch, int64_t images, double loss, double lr);
  /// Ends the live bar's line.
  void finish();

 private:
  std::string label_, unit_;
  int64_t total_, first_;
  bool live_;
  int64_t log_interval_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;
};

/// "1:05" / "1:02:03".
std::string format_duration(double seconds);
/// True when stdout is a terminal.
bool stdout_is_terminal();

}  // namespace convnn::cli
