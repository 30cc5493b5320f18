#pragma once
// A data loader over an in-memory ImageSet: background worker threads build batches (shuffle,
// random crop with padding, horizontal flip, normalisation) into a bounded prefetch queue.
// Everything random is a function of (seed, epoch, sample index), so a batch is the same whatever
// the number of workers, and an epoch can be resumed at any batch.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "convnn/data/datasets.h"

namespace convnn::data {

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;      // a permutation of the samples per epoch, from (seed, epoch)
  bool drop_last = false;   // drop the last incomplete batch
  uint64_t seed = 0;
  int64_t workers = 2;      // background threads; 0 builds batches on the calling thread
  int64_t prefetch = 4;     // batches held ready, at most
  int64_t crop_padding = 0; // random crop of the original size from the zero-padded image; 0: off
  double hflip = 0.0;       // probability of a horizontal flip
  std::vector<double> mean, std;  // per channel, [0,1] units; empty: no normalisation
};

struct Batch {
  at::Tensor images;   // float32 [B,C,H,W]
  at::Tensor labels;   // int64 [B]
  int64_t index = 0;   // batch number within the epoch
};

class DataLoader {
 public:
  /// Checks the options (c10::Error naming the option, its value and the rule).
  DataLoader(ImageSet set, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t batches_per_epoch() const;
  int64_t size() const;
  const ImageSet& set() const;
  const LoaderOptions& options() const;

  /// Begins epoch `epoch` at batch `first_batch` (resume); stops any epoch in flight.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  /// The next batch of the current epoch in order, or nullopt when the epoch is done. Rethrows a
  /// worker's exception.
  std::optional<Batch> next();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// The sample indices of `epoch` in loading order (identity when shuffle is off).
std::vector<int64_t> epoch_order(int64_t size, bool shuffle, uint64_t seed, int64_t epoch);

}  // namespace convnn::data
