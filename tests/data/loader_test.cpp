// DataLoader: shuffling, worker-count independence, resume, augmentation geometry, normalisation,
// drop_last and option checks. Labels are the sample indices, so a batch says which samples it
// holds.
#include "convnn/data/loader.h"

#include <gtest/gtest.h>
#include <ATen/DeviceAccelerator.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "data/fixtures.h"

namespace loader_test {  // apart from the files of its unity batch (tests/CMakeLists.txt)

namespace {

using namespace convnn::data;
using namespace convnn::testing;

ImageSet indexed_set(int64_t n, int64_t channels = 3, int64_t height = 5, int64_t width = 6) {
  ImageSet set;
  set.images = random_images({n, channels, height, width}, 50);
  set.labels = torch::arange(n, torch::kLong);
  set.class_names.assign(static_cast<size_t>(n), "sample");
  return set;
}

LoaderOptions augmenting(int64_t workers) {
  LoaderOptions options;
  options.batch_size = 8;
  options.seed = 1234;
  options.workers = workers;
  options.prefetch = 2;
  options.crop_padding = 2;
  options.hflip = 0.5;
  options.mean = {0.5, 0.4, 0.3};
  options.std = {0.2, 0.25, 0.3};
  return options;
}

std::vector<Batch> rest_of_epoch(DataLoader& loader) {
  std::vector<Batch> batches;
  while (auto batch = loader.next()) batches.push_back(std::move(*batch));
  return batches;
}

std::vector<Batch> epoch(DataLoader& loader, int64_t e, int64_t first_batch = 0) {
  loader.start_epoch(e, first_batch);
  return rest_of_epoch(loader);
}

void expect_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].index, b[i].index);
    EXPECT_TRUE(torch::equal(a[i].inputs, b[i].inputs)) << "batch " << a[i].index;
    EXPECT_TRUE(torch::equal(a[i].labels, b[i].labels)) << "batch " << a[i].index;
  }
}

std::vector<int64_t> labels_of(const std::vector<Batch>& batches) {
  std::vector<int64_t> all;
  for (const auto& b : batches) {
    const auto* p = b.labels.data_ptr<int64_t>();
    all.insert(all.end(), p, p + b.labels.numel());
  }
  return all;
}

TEST(LoaderOrder, PermutationDeterministicPerSeedAndEpoch) {
  const auto order = epoch_order(1000, true, 7, 0);
  auto sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(order, identity);
  EXPECT_EQ(order, epoch_order(1000, true, 7, 0));
  EXPECT_NE(order, epoch_order(1000, true, 7, 1));
  EXPECT_NE(order, epoch_order(1000, true, 8, 0));
  EXPECT_EQ(epoch_order(1000, false, 7, 3), identity);
  EXPECT_TRUE(epoch_order(0, true, 7, 0).empty());
  EXPECT_EQ(epoch_order(1, true, 7, 0), std::vector<int64_t>{0});
}

// The shuffle has its own generator: torch's global one neither changes it nor is consumed.
TEST(LoaderOrder, IndependentOfTorchGenerator) {
  torch::manual_seed(1);
  const auto before = torch::rand({4});
  torch::manual_seed(1);
  const auto order = epoch_order(100, true, 3, 2);
  EXPECT_TRUE(torch::equal(torch::rand({4}), before));
  torch::manual_seed(99);
  EXPECT_EQ(epoch_order(100, true, 3, 2), order);
}

TEST(LoaderOrder, BadArguments) {
  EXPECT_NE(error_of([] { epoch_order(-1, true, 0, 0); }).find("size"), std::string::npos);
  EXPECT_NE(error_of([] { epoch_order(5, true, 0, -1); }).find("epoch"), std::string::npos);
}

// Proves the DistributedSampler rule: shards interleave one global order, so that batch b of
// every shard together is batch b of the whole order with world-size times the batch; padded
// shards are equally long (the order's first samples again), unpadded ones hold every sample once.
TEST(LoaderShards, ShardsInterleaveOneGlobalOrder) {
  const auto order = epoch_order(37, true, 9, 2);
  for (const int64_t world : {1, 2, 3, 5, 40}) {
    SCOPED_TRACE(world);
    std::multiset<int64_t> unpadded, padded;
    const int64_t padded_size = (37 + world - 1) / world * world;
    for (int64_t rank = 0; rank < world; ++rank) {
      const auto shard = shard_order(order, rank, world, /*pad=*/true);
      EXPECT_EQ(static_cast<int64_t>(shard.size()), padded_size / world);
      for (size_t i = 0; i < shard.size(); ++i) {
        EXPECT_EQ(shard[i], order[(rank + static_cast<int64_t>(i) * world) % 37]);
        padded.insert(shard[i]);
      }
      for (const auto sample : shard_order(order, rank, world, /*pad=*/false)) unpadded.insert(sample);
    }
    EXPECT_EQ(unpadded, std::multiset<int64_t>(order.begin(), order.end()));
    EXPECT_EQ(static_cast<int64_t>(padded.size()), padded_size);
  }
  EXPECT_NE(error_of([&] { shard_order(order, 2, 2, true); }).find("rank must be in [0, count)"), std::string::npos);
}

// Proves a sharded loader hands out its shard of each epoch, the same samples with any number
// of workers, and that two shards' batch b together are the unsharded loader's batch b with
// twice the batch size.
TEST(LoaderShards, TwoShardsTogetherAreTheWholeBatches) {
  auto whole_options = augmenting(0);
  whole_options.batch_size = 8;
  DataLoader whole(indexed_set(40), whole_options);
  const auto expected = epoch(whole, 1);
  std::vector<std::vector<Batch>> shards;
  for (const int64_t rank : {0, 1}) {
    auto options = augmenting(rank + 1);  // workers differ: the batches must not
    options.batch_size = 4;
    options.shard_rank = rank;
    options.shard_count = 2;
    DataLoader loader(indexed_set(40), options);
    EXPECT_EQ(loader.samples_per_epoch(), 20);
    shards.push_back(epoch(loader, 1));
  }
  ASSERT_EQ(shards[0].size(), expected.size());
  for (size_t b = 0; b < expected.size(); ++b) {
    std::vector<int64_t> together;
    for (const auto& shard : shards) {
      const auto labels = shard[b].labels;
      together.insert(together.end(), labels.data_ptr<int64_t>(), labels.data_ptr<int64_t>() + labels.numel());
    }
    std::vector<int64_t> wanted(expected[b].labels.data_ptr<int64_t>(),
                                expected[b].labels.data_ptr<int64_t>() + expected[b].labels.numel());
    std::sort(together.begin(), together.end());
    std::sort(wanted.begin(), wanted.end());
    EXPECT_EQ(together, wanted) << "batch " << b;
  }
}

TEST(DataLoader, BatchesFollowTheEpochOrder) {
  DataLoader loader(indexed_set(37), augmenting(2));
  EXPECT_EQ(loader.size(), 37);
  EXPECT_EQ(loader.batches_per_epoch(), 5);
  const auto batches = epoch(loader, 3);
  ASSERT_EQ(batches.size(), 5u);
  for (size_t i = 0; i < batches.size(); ++i) {
    EXPECT_EQ(batches[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(batches[i].inputs.scalar_type(), torch::kFloat);
    EXPECT_EQ(batches[i].inputs.sizes(),
              (std::vector<int64_t>{i < 4 ? 8 : 5, 3, 5, 6}));
  }
  EXPECT_EQ(labels_of(batches), epoch_order(37, true, 1234, 3));
  EXPECT_NE(labels_of(epoch(loader, 4)), labels_of(batches));
  // The epoch is over until the next start_epoch.
  EXPECT_FALSE(loader.next().has_value());
  EXPECT_FALSE(loader.next().has_value());
}

TEST(DataLoader, SameBatchesForAnyWorkerCount) {
  DataLoader reference(indexed_set(61), augmenting(0));
  const auto expected = epoch(reference, 2);
  for (const int64_t workers : {1, 3}) {
    DataLoader loader(indexed_set(61), augmenting(workers));
    expect_same_batches(epoch(loader, 2), expected);
  }
  // A second run of the same epoch is the same too.
  expect_same_batches(epoch(reference, 2), expected);
}

TEST(DataLoader, ResumeEqualsTheTailOfAFullEpoch) {
  DataLoader loader(indexed_set(61), augmenting(3));
  const auto full = epoch(loader, 5);
  ASSERT_EQ(full.size(), 8u);
  for (const int64_t first : {0, 3, 7, 8}) {
    const auto tail = epoch(loader, 5, first);
    expect_same_batches(tail, std::vector<Batch>(full.begin() + first, full.end()));
  }
  // Interrupting an epoch in flight, with batches still being built, then resuming it.
  loader.start_epoch(1);
  ASSERT_TRUE(loader.next().has_value());
  expect_same_batches(epoch(loader, 5, 2), std::vector<Batch>(full.begin() + 2, full.end()));
}

TEST(DataLoader, FirstNextStartsEpochZero) {
  DataLoader loader(indexed_set(20), augmenting(1));
  const auto batches = rest_of_epoch(loader);
  EXPECT_EQ(labels_of(batches), epoch_order(20, true, 1234, 0));
}

TEST(DataLoader, DestroyMidEpoch) {
  for (const int64_t workers : {1, 4}) {
    auto options = augmenting(workers);
    options.batch_size = 2;
    DataLoader loader(indexed_set(200), options);
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
    loader.start_epoch(1);  // never consumed
  }
  SUCCEED();
}

// With padding p and no flip, every output is some window of the zero-padded input, offsets in
// [0, 2p] on both axes, and more than one offset occurs.
TEST(DataLoader, CropIsAWindowOfThePaddedImage) {
  const int64_t p = 2;
  auto options = augmenting(2);
  options.hflip = 0.0;
  options.mean.clear();
  options.std.clear();
  options.crop_padding = p;
  const auto set = indexed_set(40, 2, 7, 9);
  DataLoader loader(set, options);
  const auto padded = torch::constant_pad_nd(set.images, {p, p, p, p}).to(torch::kFloat) / 255;
  std::set<std::pair<int64_t, int64_t>> offsets;
  using torch::indexing::Slice;
  for (const auto& batch : epoch(loader, 0)) {
    EXPECT_EQ(batch.inputs.sizes().slice(1), set.images.sizes().slice(1));
    for (int64_t i = 0; i < batch.labels.size(0); ++i) {
      const auto sample = batch.labels[i].item<int64_t>();
      bool found = false;
      for (int64_t dy = 0; dy <= 2 * p && !found; ++dy) {
        for (int64_t dx = 0; dx <= 2 * p && !found; ++dx) {
          const auto window = padded[sample].index({Slice(), Slice(dy, dy + 7), Slice(dx, dx + 9)});
          if (torch::allclose(batch.inputs[i], window, 0, 1e-6)) {
            found = true;
            offsets.insert({dy, dx});
          }
        }
      }
      EXPECT_TRUE(found) << "sample " << sample;
    }
  }
  EXPECT_GT(offsets.size(), 3u);
}

TEST(DataLoader, FlipWithProbabilityOneMirrors) {
  auto options = augmenting(1);
  options.crop_padding = 0;
  options.hflip = 1.0;
  options.mean.clear();
  options.std.clear();
  const auto set = indexed_set(13);
  DataLoader loader(set, options);
  for (const auto& batch : epoch(loader, 0)) {
    const auto expected = set.images.index_select(0, batch.labels).flip({3}).to(torch::kFloat);
    EXPECT_TRUE(torch::allclose(batch.inputs, expected / 255, 0, 1e-6));
  }
}

// No augmentation, no shuffle: (x / 255 - mean[c]) / std[c] in sample order.
TEST(DataLoader, Normalisation) {
  auto options = augmenting(0);
  options.shuffle = false;
  options.crop_padding = 0;
  options.hflip = 0.0;
  const auto set = indexed_set(10);
  DataLoader loader(set, options);
  const auto batches = epoch(loader, 0);
  const auto images = torch::cat({batches[0].inputs, batches[1].inputs});
  const auto mean = torch::tensor(options.mean, torch::kDouble).view({1, 3, 1, 1});
  const auto std = torch::tensor(options.std, torch::kDouble).view({1, 3, 1, 1});
  const auto expected = (set.images.to(torch::kDouble) / 255 - mean) / std;
  EXPECT_TRUE(torch::allclose(images.to(torch::kDouble), expected, 0, 1e-6));
}

// Flips at probability 1/2 depend on the epoch: a sample is not mirrored the same way each time.
TEST(DataLoader, AugmentationChangesAcrossEpochs) {
  auto options = augmenting(0);
  options.shuffle = false;
  options.mean.clear();
  options.std.clear();
  DataLoader loader(indexed_set(16), options);
  const auto a = epoch(loader, 0), b = epoch(loader, 1);
  EXPECT_FALSE(torch::equal(a[0].inputs, b[0].inputs));
  EXPECT_TRUE(torch::equal(a[0].labels, b[0].labels));
}

TEST(DataLoader, DropLastCounts) {
  for (const bool drop_last : {false, true}) {
    auto options = augmenting(2);
    options.drop_last = drop_last;
    DataLoader loader(indexed_set(37), options);
    const auto batches = epoch(loader, 0);
    EXPECT_EQ(loader.batches_per_epoch(), drop_last ? 4 : 5);
    EXPECT_EQ(static_cast<int64_t>(batches.size()), loader.batches_per_epoch());
    EXPECT_EQ(labels_of(batches).size(), drop_last ? 32u : 37u);
    for (const auto& batch : batches) EXPECT_EQ(batch.labels.size(0), batch.index < 4 ? 8 : 5);
  }
  auto options = augmenting(0);
  options.drop_last = true;
  options.batch_size = 50;
  DataLoader loader(indexed_set(37), options);
  EXPECT_EQ(loader.batches_per_epoch(), 0);
  EXPECT_FALSE(loader.next().has_value());
}

// Each bad option is rejected, and the message names it and the value given.
TEST(DataLoader, BadOptions) {
  struct Case {
    std::function<void(LoaderOptions&)> edit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](LoaderOptions& o) { o.batch_size = 0; }, "batch_size must be >= 1, got 0"},
      {[](LoaderOptions& o) { o.workers = -1; }, "workers must be >= 0, got -1"},
      {[](LoaderOptions& o) { o.prefetch = 0; }, "prefetch must be >= 1, got 0"},
      {[](LoaderOptions& o) { o.crop_padding = -2; }, "crop_padding must be >= 0, got -2"},
      {[](LoaderOptions& o) { o.hflip = 1.5; }, "hflip must be in [0, 1], got 1.5"},
      {[](LoaderOptions& o) { o.hflip = std::nan(""); }, "hflip must be in [0, 1]"},
      {[](LoaderOptions& o) { o.std = {0.2}; }, "mean has 3 values and std has 1"},
      {[](LoaderOptions& o) { o.mean = {0.1}, o.std = {0.1}; }, "the images have 3 channels"},
      {[](LoaderOptions& o) { o.std[1] = 0; }, "std[1] must be finite and > 0, got 0"},
  };
  for (const auto& c : cases) {
    auto options = augmenting(1);
    c.edit(options);
    const auto message = error_of([&] { DataLoader(indexed_set(4), options); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
  }
  DataLoader loader(indexed_set(20), augmenting(1));
  EXPECT_NE(error_of([&] { loader.start_epoch(-1); }).find("epoch must be >= 0, got -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { loader.start_epoch(0, 4); }).find("first_batch must be in [0, 3]"),
            std::string::npos);
}

bool accelerator_present() {
  return at::accelerator::getAccelerator(/*checked=*/false).has_value() && at::accelerator::deviceCount() > 0;
}

// Pinning needs an accelerator's host allocator: without one the loader refuses the option when
// it is made, not in a worker at the first batch.
TEST(DataLoader, PinMemoryWithoutAnAcceleratorIsRefused) {
  if (accelerator_present()) GTEST_SKIP() << "an accelerator is present: pinning is allowed here";
  auto options = augmenting(1);
  options.pin_memory = true;
  const auto message = error_of([&] { DataLoader(indexed_set(4), options); });
  EXPECT_NE(message.find("pin_memory = true needs an accelerator device"), std::string::npos) << message;
}

// Pinned batches hold the same values as unpinned ones, MixUp's soft targets included.
TEST(DataLoader, PinnedBatchesArePinnedAndUnchanged) {
  if (!accelerator_present()) GTEST_SKIP() << "no accelerator device: memory cannot be pinned";
  auto options = augmenting(2);
  options.mixup = MixupOptions{};
  DataLoader plain(indexed_set(20), options);
  options.pin_memory = true;
  DataLoader pinned(indexed_set(20), options);
  const auto expected = epoch(plain, 1), got = epoch(pinned, 1);
  expect_same_batches(expected, got);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].inputs.is_pinned() && got[i].labels.is_pinned() && got[i].targets.is_pinned());
    EXPECT_TRUE(torch::equal(got[i].targets, expected[i].targets)) << "batch " << i;
  }
}

TEST(DataLoader, BadImageSet) {
  auto set = indexed_set(4);
  set.images = set.images.to(torch::kFloat);
  EXPECT_NE(error_of([&] { DataLoader(set, augmenting(0)); }).find("images must be uint8"),
            std::string::npos);
  set = indexed_set(4);
  set.labels = set.labels.narrow(0, 0, 3);
  EXPECT_NE(error_of([&] { DataLoader(set, augmenting(0)); }).find("4 images but 3 labels"),
            std::string::npos);
}

}  // namespace

}  // namespace loader_test
