#pragma once
// What the trainer and evaluation read batches from: an epoch of batches, in order, from any
// position (resume). Two kinds exist: DataLoader (labelled images, loader.h) and TokenLoader
// (windows of text for a language model, text.h).
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace convnn::data {

struct Batch {
  /// Images float32 [B,C,H,W] (DataLoader), or tokens int64 [B,T] (TokenLoader).
  at::Tensor inputs;
  /// int64: one label per image [B] (the hard labels, also under MixUp / CutMix), or the next
  /// token of each input token [B,T].
  at::Tensor labels;
  /// float32 [B, classes], soft targets, rows summing to 1; undefined without MixUp / CutMix.
  at::Tensor targets;
  int64_t index = 0;                 // batch number within the epoch
  std::vector<std::string> skipped;  // why each left-out sample was skipped (file and error)
};

class BatchStream {
 public:
  virtual ~BatchStream() = default;
  virtual int64_t batches_per_epoch() const = 0;
  /// Samples (images, or windows of text) of this process's shard of an epoch.
  virtual int64_t samples_per_epoch() const = 0;
  virtual int64_t num_classes() const = 0;
  virtual const std::vector<std::string>& class_names() const = 0;
  /// Begins epoch `epoch` at batch `first_batch` (resume); stops any epoch in flight.
  virtual void start_epoch(int64_t epoch, int64_t first_batch = 0) = 0;
  /// The next batch of the current epoch in order, or nullopt when the epoch is done.
  virtual std::optional<Batch> next() = 0;
  /// Samples skipped (unreadable) in the batches next() has returned since start_epoch.
  virtual int64_t skipped() const = 0;
};

}  // namespace convnn::data
