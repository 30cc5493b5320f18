// The data config's loaders: a split with its subset, the options and transforms a config and a
// LoaderSetup give, and the shards of a data-parallel run.
#include "convnn/data/config_loader.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "data/fixtures.h"

namespace convnn::data {
namespace {

DataConfig folder(const std::string& root) {
  DataConfig d;
  d.dataset = "imagefolder";
  d.data_dir = root;
  d.image_size = 16;
  d.workers = 0;
  return d;
}

std::multiset<std::string> paths_of(const FileList& files) {
  return {files.paths.begin(), files.paths.end()};
}

// Evaluation counts every sample once (unpadded shards); training gives every rank the same
// number of batches (padded shards), as DistributedSampler does.
TEST(ConfigLoader, EvaluationShardsSeeEverySampleOnceTrainingShardsArePadded) {
  testing::TempDir dir;
  testing::write_image_folder(dir.path().string());  // 12 training, 6 validation images
  const auto d = folder(dir.path().string());
  AugmentationConfig a;
  a.recipe = Recipe::None;
  for (const bool training : {false, true}) {
    SCOPED_TRACE(training);
    const auto split = load_split(d, training ? Split::Train : Split::Test, 0);
    int64_t seen = 0;
    for (int64_t rank = 0; rank < 4; ++rank) {
      LoaderSetup setup;
      setup.training = training;
      setup.batch_size = 2;
      setup.shard_rank = rank;
      setup.shard_count = 4;
      auto loader = make_loader(split, d, a, setup);
      loader.start_epoch(0);
      while (auto batch = loader.next()) seen += batch->labels.size(0);
    }
    EXPECT_EQ(seen, training ? 12 : 6);  // 12 and 6 split evenly over 4: no padding needed
    const auto odd = load_split(d, training ? Split::Train : Split::Test, 0);
    LoaderSetup five;
    five.training = training;
    five.shard_count = 5;
    five.shard_rank = 4;
    EXPECT_EQ(make_loader(odd, d, a, five).samples_per_epoch(), training ? 3 : 1);  // ceil(12/5); 6 - 4 - 1
  }
}

TEST(ConfigLoader, SubsetsAreSeededAndTheSameForTheSameSeed) {
  testing::TempDir dir;
  testing::write_image_folder(dir.path().string());
  auto d = folder(dir.path().string());
  d.train_subset = 5;
  const auto a = load_split(d, Split::Train, 7), b = load_split(d, Split::Train, 7);
  EXPECT_EQ(a.size(), 5);
  EXPECT_EQ(paths_of(a.files), paths_of(b.files));
  EXPECT_NE(paths_of(a.files), paths_of(load_split(d, Split::Train, 8).files));
}

TEST(ConfigLoader, OptionsFollowTheConfigAndTheSetup) {
  DataConfig d;  // fashion-mnist, in memory
  AugmentationConfig a;
  a.crop_padding = 2;
  a.hflip = 0.5;
  a.mixup = 0.8;
  LoaderSetup setup;
  setup.training = true;
  setup.batch_size = 32;
  setup.seed = 3;
  setup.label_smoothing = 0.1;
  const auto train = loader_options(d, a, setup);
  EXPECT_EQ(train.batch_size, 32);
  EXPECT_TRUE(train.shuffle);
  EXPECT_EQ(train.seed, 3u);
  EXPECT_EQ(train.crop_padding, 2);
  EXPECT_EQ(train.hflip, 0.5);
  ASSERT_TRUE(train.mixup.has_value());
  EXPECT_EQ(train.mixup->mixup_alpha, 0.8);
  EXPECT_EQ(train.mixup->cutmix_alpha, 0.0);  // unset: off
  EXPECT_EQ(train.mixup->label_smoothing, 0.1);
  setup.training = false;
  const auto eval = loader_options(d, a, setup);
  EXPECT_FALSE(eval.shuffle);
  EXPECT_EQ(eval.crop_padding, 0);
  EXPECT_EQ(eval.hflip, 0.0);
  EXPECT_FALSE(eval.mixup.has_value());
  EXPECT_FALSE(eval.pad_shards);

  // An image folder's transforms take the recipe's values where the config leaves them unset.
  auto f = folder("/data");
  AugmentationConfig paper;
  const auto t = image_transform_options(f, paper, true);
  ASSERT_TRUE(t.rand_augment.has_value());
  EXPECT_EQ(t.rand_augment->magnitude, 9.0);
  EXPECT_EQ(t.reprob, 0.25);
  EXPECT_EQ(t.val_resize, 18);  // floor(16 / 0.875)
  // The pixel limit of the files it reads.
  EXPECT_EQ(t.max_image_pixels, kDefaultMaxImagePixels);
  f.max_image_pixels = 1000;
  EXPECT_EQ(image_transform_options(f, paper, false).max_image_pixels, 1000);
}

// max_image_pixels (--max-image-pixels) counts pixels: it must be >= 1, and the message names it,
// its value and its default.
TEST(ConfigLoader, MaxImagePixelsBelowOneIsRefusedNamingTheField) {
  for (const auto& config : {DataConfig{}, folder("/data")}) {
    for (const int64_t value : {int64_t{0}, int64_t{-5}}) {
      auto d = config;
      d.max_image_pixels = value;
      const auto message = testing::error_of([&] { validate(d, AugmentationConfig{}); });
      EXPECT_NE(message.find("max_image_pixels must be >= 1 (default 178956970), got " + std::to_string(value)),
                std::string::npos)
          << message;
    }
    EXPECT_EQ(testing::error_of([&] { validate(config, AugmentationConfig{}); }), "<no error>");
  }
}

}  // namespace
}  // namespace convnn::data
