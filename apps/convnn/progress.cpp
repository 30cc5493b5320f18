#include "progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

namespace convnn::cli {

std::string format_duration(double seconds) {
  const auto total = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  const int64_t h = total / 3600, m = total / 60 % 60, s = total % 60;
  return h > 0 ? fmt::format("{}:{:02}:{:02}", h, m, s) : fmt::format("{}:{:02}", m, s);
}

bool stdout_is_terminal() { return ::isatty(STDOUT_FILENO) == 1; }

EpochProgress::EpochProgress(std::string label, int64_t total_batches, int64_t first_batch,
                             bool live, int64_t log_interval, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total_batches), first_(first_batch), live_(live),
      log_interval_(log_interval), start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

void EpochProgress::update(int64_t batch, int64_t images, double loss, double lr) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int64_t done = batch + 1 - first_;
  const double eta = done > 0 ? elapsed / done * (total_ - batch - 1) : 0.0;
  const double rate = elapsed > 0 ? images / elapsed : 0.0;
  const bool last = batch + 1 == total_;
  if (live_) {
    // Redraw at most 10 times a second: drawing is not free on a slow terminal.
    if (!last && drawn_ && std::chrono::duration<double>(now - last_draw_).count() < 0.1) return;
    constexpr int kWidth = 28;
    const int filled = static_cast<int>(kWidth * (batch + 1) / std::max<int64_t>(1, total_));
    std::printf("\r%s [%s%s] %lld/%lld %s<%s %.0f %s loss %.4f lr %.2e\x1b[K", label_.c_str(),
                std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                static_cast<long long>(batch + 1), static_cast<long long>(total_),
                format_duration(elapsed).c_str(), format_duration(eta).c_str(), rate, unit_.c_str(), loss, lr);
    std::fflush(stdout);
    drawn_ = true;
    last_draw_ = now;
  } else if (log_interval_ > 0 && ((batch + 1) % log_interval_ == 0 || last)) {
    std::printf("%s batch %lld/%lld elapsed %s eta %s %.0f %s loss %.4f lr %.2e\n", label_.c_str(),
                static_cast<long long>(batch + 1), static_cast<long long>(total_),
                format_duration(elapsed).c_str(), format_duration(eta).c_str(), rate, unit_.c_str(), loss, lr);
    std::fflush(stdout);
  }
}

void EpochProgress::finish() {
  if (live_ && drawn_) {
    std::printf("\r\x1b[K");
    std::fflush(stdout);
  }
}

}  // namespace convnn::cli
