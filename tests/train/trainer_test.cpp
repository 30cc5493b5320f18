// Checkpoints and the training loop on small real data: a round trip restores everything, a
// resumed run repeats the uninterrupted one exactly, and a short run learns.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "convnn/train/checkpoint.h"
#include "convnn/train/optim.h"
#include "convnn/train/trainer.h"
#include "data/fixtures.h"

namespace convnn::train {
namespace {

namespace fs = std::filesystem;
const char* kFashionMnist = "/usr/share/datasets/fashion-mnist";

// A ViT small enough to train in a second, with dropout so that resuming must restore the RNG.
TrainConfig tiny_vit_config(const std::string& output) {
  TrainConfig c;
  c.model = "vit_tiny";
  c.model_config.attention = models::ViTAttention::ConvNN;
  c.model_config.k = 4;
  c.model_config.patch_size = 7;
  c.model_config.depth = 1;
  c.model_config.embed_dim = 32;
  c.model_config.num_heads = 2;
  c.model_config.dropout = 0.1;
  c.data_dir = kFashionMnist;
  c.train_subset = 640;
  c.val_subset = 200;
  c.batch_size = 64;
  c.epochs = 2;
  c.warmup_epochs = 0.5;
  c.lr = 3e-3;
  c.workers = 2;
  c.quiet = true;
  c.plots = false;
  c.output = output;
  c.experiment = "run";
  return c;
}

#define SKIP_WITHOUT_FASHION_MNIST()                                              \
  if (!fs::exists(kFashionMnist)) GTEST_SKIP() << kFashionMnist << " is not installed"

TEST(Checkpoint, RoundTripRestoresModelOptimizerAndRng) {
  testing::TempDir dir;
  TrainConfig config;
  torch::manual_seed(1);
  auto model = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::LayerNorm(std::vector<int64_t>{3}));
  auto optimizer = make_optimizer(config, *model.ptr());
  model->forward(torch::randn({2, 4})).sum().backward();
  optimizer->step();
  TrainingPosition position;
  position.epoch = 3;
  position.next_batch = 7;
  position.step = 42;
  position.loss_sum = 1.25;
  const auto path = dir.file("checkpoint.pt");
  save_checkpoint(path, config, position, *model.ptr(), *optimizer);
  const auto after_save = torch::rand({3});

  torch::manual_seed(2);
  auto other = torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::LayerNorm(std::vector<int64_t>{3}));
  auto other_optimizer = make_optimizer(config, *other.ptr());
  load_checkpoint(path, *other.ptr(), other_optimizer.get());
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(model->parameters()[i], other->parameters()[i]));
  }
  EXPECT_TRUE(torch::equal(torch::rand({3}), after_save));  // the RNG continues from the save
  // The restored AdamW state steps both models identically.
  optimizer->zero_grad();
  other_optimizer->zero_grad();
  for (auto* m : {&model, &other}) (*m)->forward(torch::ones({2, 4})).sum().backward();
  optimizer->step();
  other_optimizer->step();
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(model->parameters()[i], other->parameters()[i]));
  }
  const auto header = read_checkpoint_header(path);
  EXPECT_EQ(header.position.epoch, 3);
  EXPECT_EQ(header.position.next_batch, 7);
  EXPECT_EQ(header.position.step, 42);
  EXPECT_DOUBLE_EQ(header.position.loss_sum, 1.25);
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename(), "checkpoint.pt") << "temporary file left behind";
  }
}

TEST(Checkpoint, MismatchedModelAndDamagedFilesAreClearErrors) {
  testing::TempDir dir;
  TrainConfig config;
  auto model = torch::nn::Linear(4, 3);
  auto optimizer = make_optimizer(config, *model.ptr());
  const auto path = dir.file("checkpoint.pt");
  save_checkpoint(path, config, {}, *model.ptr(), *optimizer);
  auto wider = torch::nn::Linear(4, 5);
  testing::expect_error([&] { load_checkpoint(path, *wider.ptr(), nullptr); }, path, "does not fit the model");
  testing::expect_error([&] { load_checkpoint(dir.file("none.pt"), *model.ptr(), nullptr); },
                        dir.file("none.pt"), "does not exist");
  const auto truncated = dir.file("truncated.pt");
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  testing::write_file(truncated, testing::Bytes(bytes.begin(), bytes.begin() + bytes.size() / 2));
  testing::expect_error([&] { read_checkpoint_header(truncated); }, truncated, "cannot be read");
}

TEST(Training, ResumedRunRepeatsTheUninterruptedLossTrajectory) {
  SKIP_WITHOUT_FASHION_MNIST();
  testing::TempDir dir;
  std::vector<double> whole, resumed;
  TrainHooks record;
  record.on_batch = [&](int64_t, double loss) { whole.push_back(loss); };
  const auto full = train(tiny_vit_config(dir.file("a")), "", record);
  ASSERT_FALSE(full.interrupted);

  TrainHooks interrupted;
  interrupted.on_batch = [&](int64_t, double loss) { resumed.push_back(loss); };
  interrupted.max_steps = 13;  // mid-epoch 2 (10 batches per epoch)
  const auto config = tiny_vit_config(dir.file("b"));
  ASSERT_TRUE(train(config, "", interrupted).interrupted);
  TrainHooks rest;
  rest.on_batch = interrupted.on_batch;
  const auto finished = train(config, latest_checkpoint_path(dir.file("b") + "/run"), rest);
  ASSERT_FALSE(finished.interrupted);
  ASSERT_EQ(resumed.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(resumed[i], whole[i]) << "batch " << i;
  ASSERT_EQ(finished.epochs.size(), full.epochs.size());
  EXPECT_EQ(finished.epochs.back().val_top1, full.epochs.back().val_top1);
  EXPECT_EQ(finished.epochs.back().train_loss, full.epochs.back().train_loss);
}

TEST(Training, ShortRunBeatsChanceByAWideMargin) {
  SKIP_WITHOUT_FASHION_MNIST();
  testing::TempDir dir;
  auto config = tiny_vit_config(dir.file("runs"));
  config.train_subset = 2000;
  config.val_subset = 500;
  config.epochs = 3;
  const auto result = train(config);
  EXPECT_GT(result.final_eval.top1, 30.0) << "chance is 10%";  // measured: 42.8%
  EXPECT_EQ(result.epochs.size(), 3u);
  const auto run = fs::path(result.run_dir);
  for (const char* file : {"config.json", "metrics.csv", "metrics.json", "checkpoint-latest.pt", "checkpoint-best.pt"}) {
    EXPECT_TRUE(fs::exists(run / file)) << file;
  }
  // The effective config reproduces the run's model.
  const auto saved = read_config((run / "config.json").string());
  EXPECT_EQ(saved.model_config.image_size, 28);
  EXPECT_EQ(saved.model_config.num_classes, 10);
}

TEST(Training, StartingOverAFinishedRunIsRefused) {
  SKIP_WITHOUT_FASHION_MNIST();
  testing::TempDir dir;
  auto config = tiny_vit_config(dir.file("runs"));
  config.epochs = 1;
  config.train_subset = 64;
  train(config);
  testing::expect_error([&] { train(config); }, dir.file("runs") + "/run", "already holds a run");
}

TEST(Training, WrongDatasetPathNamesThePath) {
  testing::TempDir dir;
  auto config = tiny_vit_config(dir.file("runs"));
  config.data_dir = dir.file("nowhere");
  testing::expect_error([&] { train(config); }, dir.file("nowhere"), "");
}

}  // namespace
}  // namespace convnn::train
