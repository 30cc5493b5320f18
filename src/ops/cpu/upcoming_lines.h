#pragma once
// The memory a task will read next, fetched a few cache lines at a time from inside the current
// task's row loops, so that its fetch overlaps the current task's work instead of stalling the
// next one. The attention kernels (knn_attention_kernel.cpp, forward and backward) list the next
// task's rows, the kernels' row loops ask for a few of them per row (UpcomingLinesCursor). Measured at the paper's Table 1
// shape on AMD Zen 5: the same backward over slices already in cache took 22.5 us per slice, over
// slices read from memory 32.7 us. Data only (no ISA-specific code), so that the per-instruction-set
// kernel files and the attention kernel may both include it.
#include <algorithm>
#include <cstdint>

namespace convnn::cpu {

class UpcomingLines {
 public:
  static constexpr int kMaxRanges = 8;
  static constexpr int64_t kLineBytes = 64;

  // At most this much in all: half of a 1 MiB L2 (AMD Zen 4 and 5 per core), so that the current
  // task's rows stay in it. A larger next task (long sequences: megabytes per slice) has its first
  // bytes fetched ahead, the rest when it reads them.
  static constexpr int64_t kMaxBytes = int64_t{512} << 10;

  // Lists [data, data + bytes) for fetching, within kMaxBytes and kMaxRanges in all.
  void add(const void* data, int64_t bytes) {
    bytes = std::min(bytes, kMaxBytes - total_bytes_);
    if (data == nullptr || bytes <= 0 || count_ == kMaxRanges) return;
    const char* begin = static_cast<const char*>(data);
    ranges_[count_++] = {begin, begin + bytes};
    total_bytes_ += bytes;
    total_lines_ += (bytes + kLineBytes - 1) / kLineBytes;
    if (count_ == 1) cursor_ = begin;
  }

  // Spreads the listed lines evenly over `row_steps` calls of step().
  void pace(int64_t row_steps) {
    lines_per_step_ = std::max<int64_t>(1, (total_lines_ + row_steps - 1) / std::max<int64_t>(1, row_steps));
  }

  // Asks for the next lines_per_step_ lines (into L2: the next task reads them, not this one).
  void step() {
    for (int64_t l = 0; l < lines_per_step_ && current_ < count_; ++l) {
      __builtin_prefetch(cursor_, 0, 2);
      cursor_ += kLineBytes;
      if (cursor_ >= ranges_[current_].end && ++current_ < count_) cursor_ = ranges_[current_].begin;
    }
  }

 private:
  struct Range {
    const char* begin;
    const char* end;
  };
  Range ranges_[kMaxRanges] = {};
  int count_ = 0, current_ = 0;
  const char* cursor_ = nullptr;
  int64_t total_bytes_ = 0, total_lines_ = 0, lines_per_step_ = 1;
};

// Non-null while a task with a successor runs on this thread (UpcomingLinesScope).
inline thread_local UpcomingLines* upcoming_lines = nullptr;

// Makes `lines` this thread's upcoming lines while it lives, and restores the previous ones after.
class UpcomingLinesScope {
 public:
  explicit UpcomingLinesScope(UpcomingLines& lines) : previous_(upcoming_lines) { upcoming_lines = &lines; }
  ~UpcomingLinesScope() { upcoming_lines = previous_; }
  UpcomingLinesScope(const UpcomingLinesScope&) = delete;
  UpcomingLinesScope& operator=(const UpcomingLinesScope&) = delete;

 private:
  UpcomingLines* previous_;
};

// The upcoming lines of the thread that constructs it, read once: each access to a thread_local of
// a shared library is a call (__tls_get_addr), too dear once per row. A kernel's row loop builds one
// per parallel task and calls step() once per row.
class UpcomingLinesCursor {
 public:
  UpcomingLinesCursor() : lines_(upcoming_lines) {}
  void step() const {
    if (lines_ != nullptr) lines_->step();
  }

 private:
  UpcomingLines* lines_;
};

}  // namespace convnn::cpu
