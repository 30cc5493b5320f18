#include "convnn/data/loader.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>

namespace convnn::data {
namespace {

// Separate streams for the epoch's order and the samples' augmentation, so that turning one on
// never changes the other.
constexpr uint64_t kOrderStream = 0x6f72646572ULL;    // "order"
constexpr uint64_t kAugmentStream = 0x6175676d656eULL;  // "augmen"

// splitmix64 (Steele, Lea and Flood, 2014): a tiny generator whose output is a pure function of
// its key, so shuffles and augmentations never touch torch's global generator or depend on which
// thread drew them.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class Rng {
 public:
  // Each key word goes through a full mixing step, so nearby keys give unrelated streams.
  Rng(uint64_t stream, uint64_t seed, uint64_t a, uint64_t b = 0) : state_(stream) {
    for (const uint64_t word : {seed, a, b}) {
      state_ ^= word;
      state_ = splitmix64(state_);
    }
  }
  double uniform() { return static_cast<double>(splitmix64(state_) >> 11) * 0x1.0p-53; }
  /// Uniform in [0, n).
  int64_t below(int64_t n) {
    return std::min(n - 1, static_cast<int64_t>(uniform() * static_cast<double>(n)));
  }

 private:
  uint64_t state_;
};

struct Augment {
  int64_t dy = 0, dx = 0;  // window offset in the padded image, in [0, 2 * crop_padding]
  bool flip = false;
};

// Drawn in a fixed order whatever is enabled, so each choice depends only on its key.
Augment augment_of(const LoaderOptions& options, int64_t epoch, int64_t sample) {
  Rng rng(kAugmentStream, options.seed, static_cast<uint64_t>(epoch),
          static_cast<uint64_t>(sample));
  Augment a;
  a.dy = rng.below(2 * options.crop_padding + 1);
  a.dx = rng.below(2 * options.crop_padding + 1);
  a.flip = rng.uniform() < options.hflip;
  return a;
}

struct Geometry {
  int64_t channels, height, width, padding;
};

// out[c][y][x] = table[c][padded[c][y + dy][x' + dx]] with x' = W - 1 - x when flipped (crop,
// then flip), where padded is the image with `padding` zeros on every side.
void write_sample(const uint8_t* src, float* dst, const Augment& a, const Geometry& g,
                  const float* lut) {
  const int64_t h = g.height, w = g.width;
  for (int64_t c = 0; c < g.channels; ++c) {
    const float* table = lut + 256 * c;
    for (int64_t y = 0; y < h; ++y) {
      float* row = dst + (c * h + y) * w;
      const int64_t sy = y + a.dy - g.padding;
      if (sy < 0 || sy >= h) {
        std::fill(row, row + w, table[0]);
        continue;
      }
      const uint8_t* src_row = src + (c * h + sy) * w;
      for (int64_t x = 0; x < w; ++x) {
        const int64_t sx = (a.flip ? w - 1 - x : x) + a.dx - g.padding;
        row[x] = table[sx >= 0 && sx < w ? src_row[sx] : 0];
      }
    }
  }
}

// Every uint8 value's float, normalised: one lookup per pixel instead of a divide.
std::vector<float> value_table(const LoaderOptions& options, int64_t channels) {
  std::vector<float> lut(static_cast<size_t>(256 * channels));
  for (int64_t c = 0; c < channels; ++c) {
    for (int v = 0; v < 256; ++v) {
      double x = v / 255.0;
      if (!options.mean.empty()) x = (x - options.mean[c]) / options.std[c];
      lut[static_cast<size_t>(256 * c + v)] = static_cast<float>(x);
    }
  }
  return lut;
}

void check_set(const ImageSet& set) {
  TORCH_CHECK(set.images.defined() && set.labels.defined(),
              "DataLoader: the image set has no images or no labels");
  TORCH_CHECK(set.images.dim() == 4 && set.images.scalar_type() == at::kByte &&
                  set.images.device().is_cpu(),
              "DataLoader: images must be uint8 [N,C,H,W] on the CPU, got ",
              set.images.scalar_type(), " ", set.images.sizes(), " on ", set.images.device());
  TORCH_CHECK(set.labels.dim() == 1 && set.labels.scalar_type() == at::kLong &&
                  set.labels.device().is_cpu(),
              "DataLoader: labels must be int64 [N] on the CPU, got ", set.labels.scalar_type(),
              " ", set.labels.sizes(), " on ", set.labels.device());
  TORCH_CHECK(set.images.size(0) == set.labels.size(0), "DataLoader: ", set.images.size(0),
              " images but ", set.labels.size(0), " labels");
}

void check_normalisation(const LoaderOptions& o, int64_t channels) {
  TORCH_CHECK(o.mean.size() == o.std.size(), "DataLoader: mean has ", o.mean.size(),
              " values and std has ", o.std.size(), "; give both (one per channel) or neither");
  TORCH_CHECK(o.mean.empty() || static_cast<int64_t>(o.mean.size()) == channels,
              "DataLoader: mean and std have ", o.mean.size(), " values, the images have ",
              channels, " channels");
  for (size_t c = 0; c < o.mean.size(); ++c) {
    TORCH_CHECK(std::isfinite(o.mean[c]), "DataLoader: mean[", c, "] must be finite, got ",
                o.mean[c]);
    TORCH_CHECK(std::isfinite(o.std[c]) && o.std[c] > 0, "DataLoader: std[", c,
                "] must be finite and > 0, got ", o.std[c]);
  }
}

void check_options(const LoaderOptions& o, int64_t channels) {
  TORCH_CHECK(o.batch_size >= 1, "DataLoader: batch_size must be >= 1, got ", o.batch_size);
  TORCH_CHECK(o.workers >= 0, "DataLoader: workers must be >= 0, got ", o.workers);
  TORCH_CHECK(o.prefetch >= 1, "DataLoader: prefetch must be >= 1, got ", o.prefetch);
  TORCH_CHECK(o.crop_padding >= 0, "DataLoader: crop_padding must be >= 0, got ",
              o.crop_padding);
  TORCH_CHECK(o.hflip >= 0.0 && o.hflip <= 1.0, "DataLoader: hflip must be in [0, 1], got ",
              o.hflip);
  check_normalisation(o, channels);
}

// A finished batch, or the exception that building it threw.
struct Slot {
  std::optional<Batch> batch;
  std::exception_ptr error;
};

}  // namespace

// Workers take batch numbers in increasing order, never more than `prefetch` ahead of the one
// next() waits for, and file the results by number; next() hands them out in order. Everything
// under `mutex` is shared; the epoch (order, epoch, batches) only changes with no worker running.
struct DataLoader::State {
  ImageSet set;
  LoaderOptions options;
  Geometry geometry{};
  std::vector<float> lut;
  int64_t batches = 0;

  bool started = false;
  int64_t epoch = 0;
  std::vector<int64_t> order;
  std::exception_ptr failure;  // delivered by next(): the epoch ends there

  std::mutex mutex;
  std::condition_variable space;  // a worker may take the next batch number
  std::condition_variable ready;  // a batch was filed
  int64_t next_take = 0;
  int64_t next_out = 0;
  bool stopping = false;
  std::map<int64_t, Slot> done;
  std::vector<std::thread> threads;

  Batch build(int64_t index) const;
  void work();
  void stop();
  void start(int64_t first_batch);
  Batch take();
};

Batch DataLoader::State::build(int64_t index) const {
  const int64_t n = set.size();
  const int64_t begin = index * options.batch_size;
  const int64_t count = std::min(options.batch_size, n - begin);
  const auto& g = geometry;
  const int64_t plane = g.channels * g.height * g.width;
  Batch batch;
  batch.index = index;
  batch.images = at::empty({count, g.channels, g.height, g.width}, at::kFloat);
  batch.labels = at::empty({count}, at::kLong);
  const auto* images = set.images.data_ptr<uint8_t>();
  const auto* labels = set.labels.data_ptr<int64_t>();
  auto* out_images = batch.images.data_ptr<float>();
  auto* out_labels = batch.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t sample = order[static_cast<size_t>(begin + i)];
    out_labels[i] = labels[sample];
    write_sample(images + sample * plane, out_images + i * plane,
                 augment_of(options, epoch, sample), g, lut.data());
  }
  return batch;
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

DataLoader::DataLoader(ImageSet set, LoaderOptions options) : state_(std::make_unique<State>()) {
  check_set(set);
  check_options(options, set.images.size(1));
  auto& s = *state_;
  s.set = std::move(set);
  // Workers read raw pointers with dense strides.
  s.set.images = s.set.images.contiguous();
  s.set.labels = s.set.labels.contiguous();
  s.options = std::move(options);
  s.geometry = {s.set.images.size(1), s.set.images.size(2), s.set.images.size(3),
                s.options.crop_padding};
  s.lut = value_table(s.options, s.geometry.channels);
  const int64_t n = s.set.size(), b = s.options.batch_size;
  s.batches = s.options.drop_last ? n / b : (n + b - 1) / b;
}

DataLoader::~DataLoader() {
  if (state_) state_->stop();
}

int64_t DataLoader::batches_per_epoch() const { return state_->batches; }
int64_t DataLoader::size() const { return state_->set.size(); }
const ImageSet& DataLoader::set() const { return state_->set; }
const LoaderOptions& DataLoader::options() const { return state_->options; }

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  auto& s = *state_;
  TORCH_CHECK(epoch >= 0, "DataLoader::start_epoch: epoch must be >= 0, got ", epoch);
  TORCH_CHECK(first_batch >= 0 && first_batch <= s.batches,
              "DataLoader::start_epoch: first_batch must be in [0, ", s.batches, "], got ",
              first_batch);
  s.stop();
  s.epoch = epoch;
  s.order = epoch_order(s.set.size(), s.options.shuffle, s.options.seed, epoch);
  s.start(first_batch);
}

std::optional<Batch> DataLoader::next() {
  auto& s = *state_;
  if (!s.started) start_epoch(0);
  if (s.failure) std::rethrow_exception(s.failure);
  if (s.next_out >= s.batches) return std::nullopt;
  if (!s.threads.empty()) return s.take();
  // No workers: build on the calling thread; a failure leaves next_out for a retry.
  Batch batch = s.build(s.next_out);
  ++s.next_out;
  return batch;
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
