// The DataLoader over image files (ImageFolderSource): shapes, value ranges and labels; the same
// batches for any number of workers with the whole paper recipe, MixUp / CutMix included; resume;
// unreadable files skipped and counted, or fatal in strict mode; validation centre crops; a flat
// validation folder labelled by its labels file. Tiny images (40x30) keep it fast.
#include "convnn/data/image_folder_source.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/data/image_codec.h"
#include "convnn/data/loader.h"
#include "data/fixtures.h"

namespace {

using namespace convnn::data;
using namespace convnn::testing;

constexpr int64_t kSize = 16;

ImageTransformOptions plain(int64_t size = kSize) {
  ImageTransformOptions o;
  o.image_size = size;
  return o;
}

// The paper's recipe: RandAugment m9 mstd0.5 n2, colour jitter 0.4, erasing 0.25.
ImageTransformOptions paper(int64_t size = kSize) {
  auto o = plain(size);
  o.rand_augment = RandAugmentOptions{};
  o.color_jitter = 0.4;
  o.reprob = 0.25;
  return o;
}

LoaderOptions batching(int64_t workers, bool mixup = false) {
  LoaderOptions o;
  o.batch_size = 5;
  o.seed = 7;
  o.workers = workers;
  o.prefetch = 2;
  if (mixup) o.mixup = MixupOptions{};  // timm's: mixup 0.8, cutmix 1.0, switch 0.5, smoothing 0.1
  return o;
}

std::shared_ptr<ImageFolderSource> source(const std::string& root, bool train,
                                          const ImageTransformOptions& options) {
  return std::make_shared<ImageFolderSource>(load_image_folder_split(root, train), options);
}

std::vector<Batch> epoch(DataLoader& loader, int64_t e, int64_t first_batch = 0) {
  loader.start_epoch(e, first_batch);
  std::vector<Batch> batches;
  while (auto batch = loader.next()) batches.push_back(std::move(*batch));
  return batches;
}

void expect_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].index, b[i].index);
    EXPECT_TRUE(torch::equal(a[i].inputs, b[i].inputs)) << "batch " << a[i].index;
    EXPECT_TRUE(torch::equal(a[i].labels, b[i].labels)) << "batch " << a[i].index;
    ASSERT_EQ(a[i].targets.defined(), b[i].targets.defined());
    if (a[i].targets.defined()) {
      EXPECT_TRUE(torch::equal(a[i].targets, b[i].targets)) << "batch " << a[i].index;
    }
  }
}

torch::Tensor all_labels(const std::vector<Batch>& batches) {
  std::vector<torch::Tensor> labels;
  for (const auto& b : batches) labels.push_back(b.labels);
  return torch::cat(labels);
}

TEST(ImageLoader, TrainingBatchesAreNormalisedCropsCarryingTheFilesLabels) {
  TempDir dir;
  write_image_folder(dir.path().string());  // 3 classes x 4 training images
  auto folder = source(dir.path().string(), true, plain());
  DataLoader loader(folder, batching(2));
  EXPECT_EQ(loader.size(), 12);
  EXPECT_EQ(loader.num_classes(), 3);
  const auto batches = epoch(loader, 0);
  ASSERT_EQ(batches.size(), 3u);
  for (const auto& b : batches) {
    EXPECT_EQ(b.inputs.sizes(), (torch::IntArrayRef{b.index < 2 ? 5 : 2, 3, kSize, kSize}));
    EXPECT_EQ(b.inputs.scalar_type(), torch::kFloat);
    EXPECT_FALSE(b.targets.defined());
    EXPECT_TRUE(b.skipped.empty());
    // Without erasing, every value is a normalised pixel: (v / 255 - mean) / std, v in [0, 255].
    for (int64_t c = 0; c < 3; ++c) {
      const auto channel = b.inputs.select(1, c);
      EXPECT_GE(channel.min().item<float>(), (0.0f - kImageNetMean[c]) / kImageNetStd[c] - 1e-5f);
      EXPECT_LE(channel.max().item<float>(), (1.0f - kImageNetMean[c]) / kImageNetStd[c] + 1e-5f);
    }
  }
  std::vector<int64_t> expected;
  for (const int64_t i : epoch_order(12, true, 7, 0)) expected.push_back(folder->files().labels[i]);
  EXPECT_TRUE(torch::equal(all_labels(batches), torch::tensor(expected, torch::kLong)));
}

TEST(ImageLoader, PaperRecipeWithMixupGivesTheSameBatchesForZeroOneAndThreeWorkers) {
  TempDir dir;
  write_image_folder(dir.path().string());
  const auto folder = source(dir.path().string(), true, paper());
  DataLoader reference(folder, batching(0, true));
  const auto expected = epoch(reference, 1);
  for (const int64_t workers : {1, 3}) {
    DataLoader loader(folder, batching(workers, true));
    expect_same_batches(epoch(loader, 1), expected);
  }
  expect_same_batches(epoch(reference, 1), expected);  // and again on the same loader
  // The augmentation depends on the epoch.
  EXPECT_FALSE(torch::equal(epoch(reference, 2)[0].inputs, expected[0].inputs));
}

TEST(ImageLoader, MixupTargetsAreSoftRowsSummingToOneWhileLabelsStayHard) {
  TempDir dir;
  write_image_folder(dir.path().string());
  DataLoader loader(source(dir.path().string(), true, paper()), batching(2, true));
  bool mixed = false;
  for (const auto& b : epoch(loader, 0)) {
    ASSERT_TRUE(b.targets.defined());
    EXPECT_EQ(b.targets.sizes(), (torch::IntArrayRef{b.labels.size(0), 3}));
    EXPECT_TRUE(torch::allclose(b.targets.sum(1), torch::ones({b.labels.size(0)}), 0, 1e-5));
    EXPECT_GE(b.labels.min().item<int64_t>(), 0);
    EXPECT_LT(b.labels.max().item<int64_t>(), 3);
    // Smoothed one-hot rows (0.1 over 3 classes) have 0.9333 on the label; mixed ones less.
    const auto on_label = b.targets.gather(1, b.labels.unsqueeze(1));
    mixed = mixed || on_label.min().item<float>() < 0.93f;
  }
  EXPECT_TRUE(mixed) << "no batch was mixed";
}

TEST(ImageLoader, ResumingAtABatchGivesTheRestOfTheEpoch) {
  TempDir dir;
  write_image_folder(dir.path().string(), {3, 5, 1});  // 15 images: batches of 5, 5, 5
  DataLoader loader(source(dir.path().string(), true, paper()), batching(2, true));
  const auto full = epoch(loader, 4);
  ASSERT_EQ(full.size(), 3u);
  for (const int64_t first : {1, 2, 3}) {
    expect_same_batches(epoch(loader, 4, first), std::vector<Batch>(full.begin() + first, full.end()));
  }
}

TEST(ImageLoader, UnreadableFilesAreSkippedReportedByNameInOrderAndCounted) {
  TempDir dir;
  write_image_folder(dir.path().string());
  const auto garbage = dir.file("train/c0/train_001.jpg");
  const auto truncated = dir.file("train/c2/train_000.jpg");
  write_garbage(garbage);
  truncate_half(truncated);
  auto options = batching(2, true);
  options.shuffle = false;  // files in order: c0's second is in batch 0, c2's first in batch 1
  std::vector<std::string> reported;
  options.on_skipped = [&reported](const std::string& reason) { reported.push_back(reason); };
  DataLoader loader(source(dir.path().string(), true, paper()), options);
  ::testing::internal::CaptureStderr();
  const auto batches = epoch(loader, 0);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");  // the library prints nothing
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].labels.size(0), 4);
  EXPECT_EQ(batches[1].labels.size(0), 4);
  EXPECT_EQ(batches[2].labels.size(0), 2);
  EXPECT_EQ(batches[1].targets.size(0), 4);  // MixUp / CutMix on what is left
  ASSERT_EQ(batches[0].skipped.size(), 1u);
  ASSERT_EQ(batches[1].skipped.size(), 1u);
  EXPECT_NE(batches[0].skipped[0].find(garbage), std::string::npos) << batches[0].skipped[0];
  EXPECT_NE(batches[1].skipped[0].find(truncated), std::string::npos) << batches[1].skipped[0];
  EXPECT_EQ(loader.skipped(), 2);
  // Once each, in the order of the batches (the workers build them in any order).
  EXPECT_EQ(reported, (std::vector<std::string>{batches[0].skipped[0], batches[1].skipped[0]}));
  EXPECT_EQ(all_labels(batches).numel(), 10);
  // The count is per epoch.
  loader.start_epoch(1);
  EXPECT_EQ(loader.skipped(), 0);
}

TEST(ImageLoader, StrictModeStopsAtTheFirstUnreadableFileNamingIt) {
  TempDir dir;
  write_image_folder(dir.path().string());
  const auto truncated = dir.file("train/c1/train_003.jpg");
  truncate_half(truncated);
  for (const int64_t workers : {0, 2}) {
    auto options = batching(workers);
    options.strict = true;
    DataLoader loader(source(dir.path().string(), true, plain()), options);
    expect_error([&] { epoch(loader, 0); }, truncated, "strict data mode");
  }
}

// A 72-byte PNG claiming 100000x100000 pixels among the training files: refused from its header
// like any other unreadable file, so skipped and reported by name (where the loader used to die
// of std::bad_alloc naming no file), or fatal in strict mode, naming it.
TEST(ImageLoader, ImageClaimingTooManyPixelsIsSkippedNamedOrFatalInStrictMode) {
  TempDir dir;
  write_image_folder(dir.path().string());
  const auto bomb = dir.file("train/c1/train_002.png");
  write_file(bomb, png_claiming(100000, 100000));
  auto options = batching(2);
  std::vector<std::string> reported;
  options.on_skipped = [&reported](const std::string& reason) { reported.push_back(reason); };
  DataLoader loader(source(dir.path().string(), true, plain()), options);
  const auto batches = epoch(loader, 0);
  EXPECT_EQ(all_labels(batches).numel(), 11);
  EXPECT_EQ(loader.skipped(), 1);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_NE(reported[0].find(bomb), std::string::npos) << reported[0];
  EXPECT_NE(reported[0].find("100000x100000 = 10000000000 pixels, more than the limit of 178956970"),
            std::string::npos)
      << reported[0];
  options.strict = true;
  DataLoader strict(source(dir.path().string(), true, plain()), options);
  expect_error([&] { epoch(strict, 0); }, bomb, "more than the limit of 178956970");
}

// The source reads with its own limit: 40x30 images (1,200 pixels) are read with a limit of
// 1,200 and refused, by name, with 1,199.
TEST(ImageLoader, SourceReadsWithItsPixelLimit) {
  TempDir dir;
  write_image_folder(dir.path().string(), {1, 1, 1});
  auto options = plain();
  options.max_image_pixels = 1200;
  const auto files = load_image_folder_split(dir.path().string(), true);
  std::vector<float> out(3 * kSize * kSize);
  std::string error;
  EXPECT_TRUE(ImageFolderSource(files, options).write(0, 1, 0, out.data(), error)) << error;
  options.max_image_pixels = 1199;
  EXPECT_FALSE(ImageFolderSource(files, options).write(0, 1, 0, out.data(), error));
  EXPECT_NE(error.find(files.paths[0]), std::string::npos) << error;
  EXPECT_NE(error.find("40x30 = 1200 pixels, more than the limit of 1199"), std::string::npos) << error;
}

// No randomness in validation: resize the shorter side to val_resize (bicubic), crop the centre.
TEST(ImageLoader, ValidationIsTheCentreCropOfTheBicubicResizedImage) {
  TempDir dir;
  write_image_folder(dir.path().string());
  auto options = plain();
  options.training = false;
  options.val_resize = 20;
  const auto folder = source(dir.path().string(), false, options);
  auto loading = batching(2);
  loading.shuffle = false;
  DataLoader loader(folder, loading);
  const auto batches = epoch(loader, 0);
  expect_same_batches(epoch(loader, 3), batches);
  const auto images = torch::cat({batches[0].inputs, batches[1].inputs});
  ASSERT_EQ(images.size(0), 6);
  for (int64_t i = 0; i < 6; ++i) {
    const auto decoded = read_image(folder->files().paths[i]);
    const auto crop = center_crop(resize_shorter(decoded, 20, Interpolation::Bicubic), kSize, kSize);
    auto expected = torch::empty({3, kSize, kSize});
    normalize_into(crop, kImageNetMean, kImageNetStd, expected.data_ptr<float>());
    EXPECT_TRUE(torch::equal(images[i], expected)) << folder->files().paths[i];
  }
  // The default resize is image_size / 0.875 (256 for 224).
  EXPECT_EQ(source(dir.path().string(), false, plain(224))->options().val_resize, 256);
  EXPECT_EQ(default_val_resize(224), 256);
}

TEST(ImageLoader, FlatValidationFolderIsLabelledByItsLabelsFile) {
  TempDir dir;
  ImageFolderSpec spec;
  spec.flat_val = true;
  write_image_folder(dir.path().string(), spec);
  auto options = plain();
  options.training = false;
  auto loading = batching(1);
  loading.shuffle = false;
  DataLoader loader(source(dir.path().string(), false, options), loading);
  EXPECT_EQ(loader.size(), 6);
  EXPECT_EQ(loader.class_names(), (std::vector<std::string>{"c0", "c1", "c2"}));
  // val_labels.txt lists val_000..val_005 as c0, c0, c1, c1, c2, c2.
  EXPECT_TRUE(torch::equal(all_labels(epoch(loader, 0)), torch::tensor({0, 0, 1, 1, 2, 2}, torch::kLong)));
}

TEST(ImageLoader, BadOptionsNameTheOptionAndTheValue) {
  TempDir dir;
  write_image_folder(dir.path().string(), {2, 1, 1});
  const auto files = load_image_folder_split(dir.path().string(), true);
  const std::vector<std::pair<std::function<void(ImageTransformOptions&)>, std::string>> cases = {
      {[](ImageTransformOptions& o) { o.image_size = 0; }, "image_size must be >= 1, got 0"},
      {[](ImageTransformOptions& o) { o.val_resize = 8; },
       "val_resize must be 0 (image_size / 0.875) or >= image_size (16), got 8"},
      {[](ImageTransformOptions& o) { o.scale = {0.9, 0.1}; }, "scale must be a finite (min, max)"},
      {[](ImageTransformOptions& o) { o.ratio = {0.0, 1.0}; }, "ratio must be a finite (min, max) with 0 < min"},
      {[](ImageTransformOptions& o) { o.hflip = 2; }, "hflip must be in [0, 1], got 2"},
      {[](ImageTransformOptions& o) { o.reprob = -0.5; }, "reprob must be in [0, 1], got -0.5"},
      {[](ImageTransformOptions& o) { o.color_jitter = -1; }, "color_jitter must be finite and >= 0"},
      {[](ImageTransformOptions& o) { o.max_image_pixels = 0; }, "max_image_pixels must be >= 1, got 0"},
  };
  for (const auto& [edit, expected] : cases) {
    auto options = plain();
    edit(options);
    const auto message = error_of([&] { ImageFolderSource(files, options); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
  auto loading = batching(0);
  loading.mixup = MixupOptions{0.0, 0.0};
  const auto message = error_of([&] { DataLoader(source(dir.path().string(), true, plain()), loading); });
  EXPECT_NE(message.find("mixup_alpha or cutmix_alpha must be > 0"), std::string::npos) << message;
}

}  // namespace
