#pragma once
// A data loader over a sample source (sample_source.h): an in-memory ImageSet (shuffle, random
// crop with padding, horizontal flip, normalisation) or image files decoded and transformed per
// sample (image_folder_source.h). Background worker threads build whole batches (read, decode,
// augment, collate, MixUp / CutMix) into a bounded prefetch queue. Everything random is a
// function of (seed, epoch, sample index) or, for MixUp / CutMix, (seed, epoch, batch index), so
// a batch is the same whatever the number of workers, and an epoch can be resumed at any batch.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "convnn/data/batch_stream.h"
#include "convnn/data/datasets.h"
#include "convnn/data/sample_source.h"
#include "convnn/data/transforms.h"

namespace convnn::data {

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;      // a permutation of the samples per epoch, from (seed, epoch)
  bool drop_last = false;   // drop the last incomplete batch
  uint64_t seed = 0;
  int64_t workers = 2;      // background threads; 0 builds batches on the calling thread
  int64_t prefetch = 4;     // batches held ready, at most
  // The transforms of an in-memory ImageSet (the DataLoader(ImageSet, ...) constructor); an
  // image-folder source carries its own (ImageTransformOptions).
  int64_t crop_padding = 0; // random crop of the original size from the zero-padded image; 0: off
  double hflip = 0.0;       // probability of a horizontal flip
  std::vector<double> mean, std;  // per channel, [0,1] units; empty: no normalisation
  // Batch level, any source.
  std::optional<MixupOptions> mixup;  // MixUp / CutMix with soft targets; nullopt: off
  /// A sample whose file cannot be read or decoded: skipped (the batch is one smaller, and
  /// on_skipped is told why) when false; a c10::Error naming the file when true.
  bool strict = false;
  /// Told why each skipped sample was left out (its file and the error), once, in order, as
  /// next() hands out its batch, on the thread that calls next(). Unset: skipped silently (the
  /// count is still in skipped()). The library prints nothing; `convnn` prints these as warnings.
  std::function<void(const std::string& reason)> on_skipped;
  /// Page-locked (pinned) batch tensors, made by the workers, so that a trainer on a CUDA device
  /// copies them with non_blocking copies that overlap its compute. Needs an accelerator that
  /// this process can use (checked when the loader is made).
  bool pin_memory = false;
  /// Data parallelism: this process loads shard `shard_rank` of `shard_count` of every epoch's
  /// order (shard_order), as PyTorch's DistributedSampler does.
  int64_t shard_rank = 0;
  int64_t shard_count = 1;
  bool pad_shards = true;  // training: equal shards; evaluation (false): no sample seen twice
};

class DataLoader final : public BatchStream {
 public:
  /// Checks the options (c10::Error naming the option, its value and the rule).
  DataLoader(ImageSet set, LoaderOptions options);
  DataLoader(std::shared_ptr<const SampleSource> source, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;
  /// The workers hold the loader's state, not the loader: a move keeps them running.
  DataLoader(DataLoader&&) noexcept;

  int64_t batches_per_epoch() const override;
  int64_t size() const;                 // samples of the source
  int64_t samples_per_epoch() const override;    // samples of this process's shard of an epoch
  const SampleSource& source() const;
  int64_t num_classes() const override { return source().num_classes(); }
  const std::vector<std::string>& class_names() const override { return source().class_names(); }
  const LoaderOptions& options() const;

  /// Begins epoch `epoch` at batch `first_batch` (resume); stops any epoch in flight.
  void start_epoch(int64_t epoch, int64_t first_batch = 0) override;
  /// The next batch of the current epoch in order, or nullopt when the epoch is done. Rethrows a
  /// worker's exception. Calls options().on_skipped for each sample the batch skipped.
  std::optional<Batch> next() override;
  /// Samples skipped in the batches next() has returned since start_epoch.
  int64_t skipped() const override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// The sample indices of `epoch` in loading order (identity when shuffle is off).
std::vector<int64_t> epoch_order(int64_t size, bool shuffle, uint64_t seed, int64_t epoch);

/// Shard `rank` of `count` of an epoch's `order`: its samples at positions rank, rank + count,
/// rank + 2 count, ..., so that batch b of every shard together holds the samples of batch b of
/// the whole order with count times the batch size. With `pad`, the order is first extended by its
/// own beginning to a multiple of `count` (every shard equally long; a few samples seen twice per
/// epoch); without, shards differ in length by at most one and every sample is in exactly one.
std::vector<int64_t> shard_order(const std::vector<int64_t>& order, int64_t rank, int64_t count, bool pad);

}  // namespace convnn::data
