#include "convnn/data/loader.h"

#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>

#include "convnn/data/rng.h"

namespace convnn::data {
namespace {

// Separate streams for the epoch's order, the samples' augmentation (in the sources) and the
// batches' MixUp / CutMix, so that turning one on never changes the others.
constexpr uint64_t kOrderStream = 0x6f72646572ULL;  // "order"
constexpr uint64_t kMixupStream = 0x6d69787570ULL;  // "mixup"

void check_options(const LoaderOptions& o) {
  TORCH_CHECK(o.batch_size >= 1, "DataLoader: batch_size must be >= 1, got ", o.batch_size);
  TORCH_CHECK(o.workers >= 0, "DataLoader: workers must be >= 0, got ", o.workers);
  TORCH_CHECK(o.prefetch >= 1, "DataLoader: prefetch must be >= 1, got ", o.prefetch);
  TORCH_CHECK(o.shard_count >= 1, "DataLoader: shard_count must be >= 1, got ", o.shard_count);
  TORCH_CHECK(o.shard_rank >= 0 && o.shard_rank < o.shard_count, "DataLoader: shard_rank must be in [0, ",
              o.shard_count, "), got ", o.shard_rank);
  // Pinning allocates through the accelerator's host allocator; without a device it would fail in
  // a worker at the first batch instead of here.
  TORCH_CHECK(!o.pin_memory || (at::accelerator::getAccelerator(/*checked=*/false).has_value() &&
                                at::accelerator::deviceCount() > 0),
              "DataLoader: pin_memory = true needs an accelerator device, and none is available to "
              "this process; leave pin_memory false for CPU training");
}

// The samples of one shard of an epoch (shard_order's length).
int64_t shard_size(int64_t size, const LoaderOptions& o) {
  if (o.pad_shards) return (size + o.shard_count - 1) / o.shard_count;
  return size / o.shard_count + (o.shard_rank < size % o.shard_count ? 1 : 0);
}

// Copies the batch into page-locked memory on the worker thread, so the trainer only launches the
// asynchronous copy to the device.
void pin(Batch& batch) {
  batch.inputs = batch.inputs.pin_memory();
  batch.labels = batch.labels.pin_memory();
  if (batch.targets.defined()) batch.targets = batch.targets.pin_memory();
}

// mixup_cutmix checks its options on every call; one call on a one-pixel batch checks them here,
// when the loader is made, rather than in a worker at the first batch.
void check_mixup(const MixupOptions& mixup) {
  auto images = at::zeros({1, 1, 1, 1}, at::kFloat);
  at::Tensor targets;
  Rng rng(0, 0, 0);
  mixup_cutmix(images, at::zeros({1}, at::kLong), 1, rng, mixup, targets);
}

}  // namespace

// Workers take batch numbers in increasing order, never more than `prefetch` ahead of the one
// next() waits for, and file the results by number; next() hands them out in order. Everything
// under `mutex` is shared; the epoch (order, epoch, batches) only changes with no worker running.
struct DataLoader::State {
  // A finished batch, or the exception that building it threw. (Here, not in the anonymous
  // namespace: State holds them, and in a unity build GCC warns of that.)
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  std::shared_ptr<const SampleSource> source;
  LoaderOptions options;
  int64_t batches = 0;

  bool started = false;
  int64_t epoch = 0;
  std::vector<int64_t> order;
  std::exception_ptr failure;  // delivered by next(): the epoch ends there
  int64_t skipped = 0;         // in the batches handed out this epoch

  std::mutex mutex;
  std::condition_variable space;  // a worker may take the next batch number
  std::condition_variable ready;  // a batch was filed
  int64_t next_take = 0;
  int64_t next_out = 0;
  bool stopping = false;
  std::map<int64_t, Slot> done;
  std::vector<std::thread> threads;

  Batch build(int64_t index) const;
  void mix(Batch& batch) const;
  Batch hand_out(Batch batch);
  void work();
  void stop();
  void start(int64_t first_batch);
  Batch take();
};

// Samples whose data cannot be read are left out (strict: the error), so a batch may be smaller
// than its share of the order; MixUp / CutMix then mixes the samples that are there.
Batch DataLoader::State::build(int64_t index) const {
  const int64_t begin = index * options.batch_size;
  const int64_t count = std::min(options.batch_size, static_cast<int64_t>(order.size()) - begin);
  const auto shape = source->sample_shape();
  const int64_t numel = source->sample_numel();
  Batch batch;
  batch.index = index;
  batch.inputs = at::empty({count, shape[0], shape[1], shape[2]}, at::kFloat);
  batch.labels = at::empty({count}, at::kLong);
  auto* out_images = batch.inputs.data_ptr<float>();
  auto* out_labels = batch.labels.data_ptr<int64_t>();
  int64_t kept = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t sample = order[static_cast<size_t>(begin + i)];
    std::string error;
    if (!source->write(sample, options.seed, epoch, out_images + kept * numel, error)) {
      TORCH_CHECK(!options.strict, error,
                  " (strict data mode: stopped at the first unreadable file; without it the file "
                  "would be skipped)");
      batch.skipped.push_back(std::move(error));
      continue;
    }
    out_labels[kept++] = source->label(sample);
  }
  if (kept < count) {
    batch.inputs = batch.inputs.narrow(0, 0, kept);
    batch.labels = batch.labels.narrow(0, 0, kept);
  }
  if (options.mixup) mix(batch);
  if (options.pin_memory) pin(batch);
  return batch;
}

void DataLoader::State::mix(Batch& batch) const {
  if (batch.labels.size(0) == 0) {
    batch.targets = at::empty({0, source->num_classes()}, at::kFloat);
    return;
  }
  Rng rng(kMixupStream, options.seed, static_cast<uint64_t>(epoch),
          static_cast<uint64_t>(batch.index));
  mixup_cutmix(batch.inputs, batch.labels, source->num_classes(), rng, *options.mixup,
               batch.targets);
}

void DataLoader::State::work() {
  for (;;) {
    int64_t index = 0;
    {
      std::unique_lock<std::mutex> lock(mutex);
      space.wait(lock, [&] {
        return stopping || next_take >= batches || next_take < next_out + options.prefetch;
      });
      if (stopping || next_take >= batches) return;
      index = next_take++;
    }
    Slot slot;
    try {
      slot.batch = build(index);
    } catch (...) {
      slot.error = std::current_exception();
    }
    const bool failed = slot.error != nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex);
      done.emplace(index, std::move(slot));
    }
    ready.notify_all();
    // Later batches would most likely fail alike; next() stops the epoch at this one anyway.
    if (failed) return;
  }
}

void DataLoader::State::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopping = true;
  }
  space.notify_all();
  // A worker finishes at most the batch it is building, so this waits for one batch at most.
  for (auto& thread : threads) thread.join();
  threads.clear();
  done.clear();
  stopping = false;
}

void DataLoader::State::start(int64_t first_batch) {
  next_take = next_out = first_batch;
  failure = nullptr;
  started = true;
  for (int64_t w = 0; w < options.workers; ++w) threads.emplace_back([this] { work(); });
}

// The batch numbered next_out, from the workers; rethrows (and ends the epoch) on their error.
Batch DataLoader::State::take() {
  Slot slot;
  {
    std::unique_lock<std::mutex> lock(mutex);
    ready.wait(lock, [&] { return done.count(next_out) > 0; });
    auto it = done.find(next_out);
    slot = std::move(it->second);
    done.erase(it);
    ++next_out;
  }
  space.notify_all();
  if (slot.error) {
    stop();
    failure = slot.error;
    std::rethrow_exception(failure);
  }
  return std::move(*slot.batch);
}

// Skips are reported as batches are handed out, not as workers build them, so they come once,
// in order, and never for a prefetched batch that a restart throws away.
Batch DataLoader::State::hand_out(Batch batch) {
  if (options.on_skipped) {
    for (const auto& reason : batch.skipped) options.on_skipped(reason);
  }
  skipped += static_cast<int64_t>(batch.skipped.size());
  return batch;
}

DataLoader::DataLoader(ImageSet set, LoaderOptions options)
    : DataLoader(image_set_source(std::move(set), {options.crop_padding, options.hflip,
                                                   options.mean, options.std}),
                 options) {}

DataLoader::DataLoader(std::shared_ptr<const SampleSource> source, LoaderOptions options)
    : state_(std::make_unique<State>()) {
  TORCH_CHECK(source != nullptr, "DataLoader: the sample source is null");
  check_options(options);
  if (options.mixup) check_mixup(*options.mixup);
  auto& s = *state_;
  s.source = std::move(source);
  s.options = std::move(options);
  const int64_t n = shard_size(s.source->size(), s.options), b = s.options.batch_size;
  s.batches = s.options.drop_last ? n / b : (n + b - 1) / b;
}

DataLoader::DataLoader(DataLoader&&) noexcept = default;

DataLoader::~DataLoader() {
  if (state_) state_->stop();
}

int64_t DataLoader::batches_per_epoch() const { return state_->batches; }
int64_t DataLoader::size() const { return state_->source->size(); }
int64_t DataLoader::samples_per_epoch() const { return shard_size(state_->source->size(), state_->options); }
const SampleSource& DataLoader::source() const { return *state_->source; }
const LoaderOptions& DataLoader::options() const { return state_->options; }
int64_t DataLoader::skipped() const { return state_->skipped; }

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  auto& s = *state_;
  TORCH_CHECK(epoch >= 0, "DataLoader::start_epoch: epoch must be >= 0, got ", epoch);
  TORCH_CHECK(first_batch >= 0 && first_batch <= s.batches,
              "DataLoader::start_epoch: first_batch must be in [0, ", s.batches, "], got ",
              first_batch);
  s.stop();
  s.epoch = epoch;
  s.order = shard_order(epoch_order(s.source->size(), s.options.shuffle, s.options.seed, epoch),
                        s.options.shard_rank, s.options.shard_count, s.options.pad_shards);
  s.skipped = 0;
  s.start(first_batch);
}

std::optional<Batch> DataLoader::next() {
  auto& s = *state_;
  if (!s.started) start_epoch(0);
  if (s.failure) std::rethrow_exception(s.failure);
  if (s.next_out >= s.batches) return std::nullopt;
  if (!s.threads.empty()) return s.hand_out(s.take());
  // No workers: build on the calling thread; a failure leaves next_out for a retry.
  Batch batch = s.build(s.next_out);
  ++s.next_out;
  return s.hand_out(std::move(batch));
}

std::vector<int64_t> epoch_order(int64_t size, bool shuffle, uint64_t seed, int64_t epoch) {
  TORCH_CHECK(size >= 0, "epoch_order: size must be >= 0, got ", size);
  TORCH_CHECK(epoch >= 0, "epoch_order: epoch must be >= 0, got ", epoch);
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle) return order;
  // Fisher-Yates.
  Rng rng(kOrderStream, seed, static_cast<uint64_t>(epoch));
  for (int64_t i = size - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  return order;
}

}  // namespace convnn::data

namespace convnn::data {

std::vector<int64_t> shard_order(const std::vector<int64_t>& order, int64_t rank, int64_t count, bool pad) {
  TORCH_CHECK(count >= 1 && rank >= 0 && rank < count, "shard_order: rank must be in [0, count) and count >= 1, "
              "got rank ", rank, " of ", count);
  const auto size = static_cast<int64_t>(order.size());
  const int64_t padded = pad ? (size + count - 1) / count * count : size;
  std::vector<int64_t> shard;
  shard.reserve(static_cast<size_t>(padded / count + 1));
  // Padding repeats the order from its start (again and again when it is shorter than count).
  for (int64_t i = rank; i < padded && size > 0; i += count) shard.push_back(order[static_cast<size_t>(i % size)]);
  return shard;
}

}  // namespace convnn::data
