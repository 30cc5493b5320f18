// Training on ImageNet-style folders: the paper recipe's defaults and their overrides, the
// checks of the image options, and one end-to-end epoch on a tiny generated folder with an
// unreadable file (metrics, checkpoint, skip count, evaluation of the checkpoint).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "convnn/checkpoint/checkpoint.h"
#include "convnn/train/trainer.h"
#include "data/fixtures.h"
#include "train/loss_recorder.h"

namespace convnn::train {
namespace {

using namespace convnn::checkpoint;
using testing_support::LossRecorder;

namespace fs = std::filesystem;

TrainConfig folder_config(const std::string& data_dir) {
  TrainConfig c;
  c.data.dataset = "imagefolder";
  c.data.data_dir = data_dir;
  return c;
}

// A ResNet-18 of width 8 on 32 px crops: one epoch of 12 images takes well under a second.
TrainConfig tiny_run(const std::string& data_dir, const std::string& output) {
  auto c = folder_config(data_dir);
  c.model = "resnet18";
  c.model_config.resnet.small_stem = true;
  c.model_config.resnet.width = 8;
  c.data.image_size = 32;
  c.augmentation.recipe = Recipe::Paper;
  c.optimization.batch_size = 4;
  c.optimization.epochs = 1;
  c.optimization.warmup_epochs = 0;
  c.data.workers = 2;
  c.run.output = output;
  c.run.experiment = "run";
  return c;
}

TEST(ImageFolderTrain, PaperRecipeIsTheImageFolderDefaultAndEachOptionOverridesIt) {
  const auto paper = apply_recipe(folder_config("/data"));
  EXPECT_EQ(paper.augmentation.recipe, Recipe::Paper);
  EXPECT_EQ(paper.data.image_size, 224);
  EXPECT_EQ(paper.data.val_resize, 256);
  EXPECT_EQ(paper.augmentation.rand_augment, 9.0);
  EXPECT_EQ(paper.augmentation.rand_augment_ops, 2);
  EXPECT_EQ(paper.augmentation.rand_augment_mstd, 0.5);
  EXPECT_EQ(paper.augmentation.color_jitter, 0.4);
  EXPECT_EQ(paper.augmentation.reprob, 0.25);
  EXPECT_EQ(paper.augmentation.mixup, 0.8);
  EXPECT_EQ(paper.augmentation.cutmix, 1.0);
  EXPECT_EQ(paper.augmentation.mixup_switch_prob, 0.5);
  EXPECT_EQ(paper.optimization.smoothing, 0.1);
  EXPECT_EQ(paper.augmentation.hflip, 0.5);
  EXPECT_EQ(paper.augmentation.scale_min, 0.08);
  EXPECT_EQ(paper.augmentation.ratio_max, 4.0 / 3.0);
  EXPECT_EQ(apply_recipe(paper).augmentation.rand_augment, 9.0);  // resolving twice changes nothing

  auto overridden = folder_config("/data");
  overridden.augmentation.mixup = 0.0;
  overridden.augmentation.rand_augment = 5.0;
  overridden.data.image_size = 160;
  const auto mine = apply_recipe(overridden);
  EXPECT_EQ(mine.augmentation.mixup, 0.0);
  EXPECT_EQ(mine.augmentation.cutmix, 1.0);
  EXPECT_EQ(mine.augmentation.rand_augment, 5.0);
  EXPECT_EQ(mine.data.val_resize, 182);  // floor(160 / 0.875)

  auto plain = folder_config("/data");
  plain.augmentation.recipe = Recipe::None;
  const auto none = apply_recipe(plain);
  const auto& off = none.augmentation;
  for (const auto& value : {off.rand_augment, off.color_jitter, off.reprob, off.mixup, off.cutmix}) {
    EXPECT_EQ(value, 0.0);
  }
  EXPECT_EQ(none.augmentation.hflip, 0.5);

  // The in-memory sets keep today's behaviour: no recipe.
  const auto cifar = apply_recipe([] {
    TrainConfig c;
    c.data.dataset = "cifar10";
    return c;
  }());
  EXPECT_EQ(cifar.augmentation.recipe, Recipe::None);
  EXPECT_EQ(cifar.augmentation.mixup, 0.0);
  EXPECT_FALSE(cifar.data.image_size.has_value());  // the set's own, once loaded
  const auto mnist = apply_recipe([] {
    TrainConfig c;
    c.data.dataset = "mnist";
    return c;
  }());
  EXPECT_EQ(mnist.augmentation.hflip, 0.0);
}

TEST(ImageFolderTrain, ValidateNamesTheImageOptionItsValueAndTheRule) {
  const auto message = [](const std::string& dataset, auto change) {
    auto c = folder_config("/data");
    c.data.dataset = dataset;
    change(c);
    return testing::error_of([&] { validate(c); });
  };
  const auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  EXPECT_EQ(message("imagefolder", [](TrainConfig&) {}), "<no error>");
  EXPECT_TRUE(has(message("cifar10", [](TrainConfig& c) { c.augmentation.rand_augment = 9; }),
                  "rand_augment applies to dataset imagefolder only"));
  EXPECT_TRUE(has(message("cifar10", [](TrainConfig& c) { c.augmentation.recipe = Recipe::Paper; }),
                  "recipe paper applies to dataset imagefolder only"));
  EXPECT_TRUE(has(message("cifar10", [](TrainConfig& c) { c.data.image_size = 64; }),
                  "image_size applies to dataset imagefolder only"));
  EXPECT_TRUE(has(message("cifar10", [](TrainConfig& c) { c.augmentation.scale_min = 0.5; }),
                  "scale applies to dataset imagefolder only"));
  EXPECT_EQ(message("cifar10", [](TrainConfig& c) { c.augmentation.mixup = 0.8; }),
            "<no error>");  // batch level
  EXPECT_TRUE(has(message("imagefolder", [](TrainConfig& c) { c.augmentation.crop_padding = 4; }),
                  "crop_padding applies to the in-memory data sets"));
  EXPECT_TRUE(has(message("imagefolder", [](TrainConfig& c) { c.data.data_dir.clear(); }),
                  "data_dir must name the root of the image folders"));
  EXPECT_TRUE(has(message("imagefolder", [](TrainConfig& c) { c.augmentation.reprob = 1.5; }),
                  "reprob must be a probability in [0, 1] (or unset: the recipe's value), got 1.5"));
  EXPECT_TRUE(
      has(message("imagefolder", [](TrainConfig& c) { c.augmentation.rand_augment = 11; }),
          "rand_augment must be a magnitude in [0, 10] (0: off) (or unset: the recipe's value), got 11"));
  EXPECT_TRUE(has(message("imagefolder", [](TrainConfig& c) { c.data.val_resize = 100; }),
                  "val_resize must be >= image_size (224) or unset (image_size / 0.875), got 100"));
  EXPECT_TRUE(
      has(message("imagefolder",
                  [](TrainConfig& c) { c.augmentation.scale_min = 0.9, c.augmentation.scale_max = 0.1; }),
          "scale must be (min, max) with 0 <= min <= max <= 1 and max > 0, got (0.9, 0.1)"));
  EXPECT_TRUE(has(message("imagefolder", [](TrainConfig& c) { c.augmentation.mixup_switch_prob = 2; }),
                  "mixup_switch_prob must be in [0, 1], got 2"));
  EXPECT_TRUE(has(message("imagenet", [](TrainConfig&) {}),
                  "dataset must be one of fashion-mnist, mnist, cifar10, cifar100, imagefolder, fortunes; got 'imagenet'"));
}

TEST(ImageFolderTrain, ConfigJsonKeepsTheImageAndAugmentationFields) {
  auto c = folder_config("/data");
  c.augmentation.recipe = Recipe::None;
  c.data.val_labels = "/data/val.txt";
  c.data.strict_data = true;
  c.augmentation.rand_augment = 7;
  c.augmentation.rand_augment_ops = 3;
  c.augmentation.scale_min = 0.25;
  const nlohmann::json json = c;
  EXPECT_EQ(json.at("recipe"), "none");
  const auto back = json.get<TrainConfig>();
  EXPECT_EQ(nlohmann::json(back), json);
  EXPECT_EQ(back.augmentation.recipe, Recipe::None);
  EXPECT_EQ(back.augmentation.rand_augment_ops, 3);
  EXPECT_FALSE(nlohmann::json(TrainConfig{}).get<TrainConfig>().augmentation.recipe.has_value());
}

TEST(ImageFolderTrain, OneEpochWithThePaperRecipeWritesMetricsCheckpointAndSkipCount) {
  testing::TempDir dir;
  const auto data = dir.file("data");
  testing::write_image_folder(data);  // 3 classes: 12 training, 6 validation images
  const auto broken = data + "/train/c1/train_000.jpg";
  testing::truncate_half(broken);
  // What a sink is told (the command prints it); the library itself prints nothing.
  struct SkipCounts : TrainingSink {
    int64_t train = -1, val = -1;
    std::vector<std::string> skipped_reasons;
    void epoch_done(const EpochMetrics& m, const Evaluation& evaluation, int64_t) override {
      train = m.skipped;
      val = evaluation.skipped;
    }
    void sample_skipped(const std::string& reason) override { skipped_reasons.push_back(reason); }
  } reported;
  TrainHooks hooks;
  hooks.sinks.push_back(&reported);
  const auto& skipped = reported.skipped_reasons;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const auto result = train(tiny_run(data, dir.file("runs")), "", hooks);
  const auto printed = ::testing::internal::GetCapturedStdout();
  const auto warnings = ::testing::internal::GetCapturedStderr();

  ASSERT_EQ(result.epochs.size(), 1u);
  EXPECT_EQ(result.epochs[0].skipped, 1);
  EXPECT_EQ(reported.train, 1);
  EXPECT_EQ(reported.val, 0);
  EXPECT_EQ(printed, "") << "the library printed";
  EXPECT_EQ(warnings, "") << "the library printed";
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find(broken), std::string::npos) << skipped[0];
  EXPECT_EQ(result.final_eval.samples, 6);
  EXPECT_TRUE(std::isfinite(result.epochs[0].train_loss));

  const auto run = fs::path(result.run_dir);
  for (const char* file : {"config.json", "metrics.csv", "metrics.json", "checkpoint-latest.pt"}) {
    EXPECT_TRUE(fs::exists(run / file)) << file;
  }
  std::ifstream metrics(run / "metrics.json");
  EXPECT_EQ(nlohmann::json::parse(metrics).at(0).at("skipped"), 1);
  // The effective config: the recipe's values, the crop size and the classes of the folder.
  const auto saved = read_config((run / "config.json").string());
  EXPECT_EQ(saved.augmentation.recipe, Recipe::Paper);
  EXPECT_EQ(saved.augmentation.mixup, 0.8);
  EXPECT_EQ(saved.augmentation.rand_augment, 9.0);
  EXPECT_EQ(saved.data.val_resize, 36);
  EXPECT_EQ(saved.model_config.image_size, 32);
  EXPECT_EQ(saved.model_config.in_channels, 3);
  EXPECT_EQ(saved.model_config.num_classes, 3);

  // convnn eval's path: the checkpoint's model on the validation folder, as the run measured it.
  const auto checkpoint = latest_checkpoint_path(result.run_dir);
  const auto evaluation =
      evaluate_checkpoint(checkpoint, read_checkpoint_header(checkpoint).config, data::Split::Test,
                          Precision::Float32);
  EXPECT_EQ(evaluation.samples, 6);
  EXPECT_EQ(evaluation.top1, result.final_eval.top1);
  EXPECT_EQ(evaluation.loss, result.final_eval.loss);
  EXPECT_EQ(evaluation.class_names, (std::vector<std::string>{"c0", "c1", "c2"}));
}

// Interrupted mid-epoch and resumed: the same losses (MixUp / CutMix included) and the same skip
// count per epoch as the uninterrupted run.
TEST(ImageFolderTrain, ResumedRunRepeatsTheLossesAndTheSkipCounts) {
  testing::TempDir dir;
  const auto data = dir.file("data");
  testing::write_image_folder(data);
  // The first sample of epoch 2: its skip happens before the interruption, so only the
  // checkpoint can carry it into the resumed epoch's count.
  const auto files = data::load_image_folder_split(data, true);
  testing::write_garbage(files.paths[data::epoch_order(files.size(), true, 0, 1)[0]]);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  std::vector<double> whole, resumed;
  LossRecorder whole_losses(whole), resumed_losses(resumed);
  TrainHooks record;
  record.sinks.push_back(&whole_losses);
  auto config = tiny_run(data, dir.file("a"));
  config.optimization.epochs = 2;
  const auto full = train(config, "", record);

  TrainHooks first;
  first.sinks.push_back(&resumed_losses);
  first.max_steps = 4;  // stops after the first batch of epoch 2 (3 batches per epoch)
  config.run.output = dir.file("b");
  const bool interrupted = train(config, "", first).interrupted;
  TrainHooks rest;
  rest.sinks = first.sinks;
  const auto finished = train(config, latest_checkpoint_path(dir.file("b") + "/run"), rest);
  ::testing::internal::GetCapturedStdout();
  ::testing::internal::GetCapturedStderr();

  ASSERT_TRUE(interrupted);
  EXPECT_EQ(resumed, whole);
  ASSERT_EQ(finished.epochs.size(), 2u);
  EXPECT_EQ(finished.epochs[0].skipped, 1);
  EXPECT_EQ(finished.epochs[1].skipped, 1);
  EXPECT_EQ(finished.epochs[1].train_loss, full.epochs[1].train_loss);
}

TEST(ImageFolderTrain, StrictDataStopsTrainingNamingTheUnreadableFile) {
  testing::TempDir dir;
  const auto data = dir.file("data");
  testing::write_image_folder(data);
  const auto broken = data + "/train/c2/train_001.jpg";
  testing::write_garbage(broken);
  auto config = tiny_run(data, dir.file("runs"));
  config.data.strict_data = true;
  testing::expect_error([&] { train(config); }, broken, "strict data mode");
}

}  // namespace
}  // namespace convnn::train
