// Training a language model with the trainer of the image models, on a small corpus in the fortune
// format: a short run learns the text, a stopped and resumed run repeats the uninterrupted one
// exactly, and a model trained on data of the other kind is refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>

#include "convnn/checkpoint/checkpoint.h"
#include "convnn/data/text.h"
#include "convnn/models/language_model.h"
#include "convnn/train/trainer.h"
#include "data/fixtures.h"
#include "support/error_message.h"
#include "train/loss_recorder.h"

namespace convnn::train {
namespace {

using convnn::testing::error_of;
using convnn::testing::TempDir;
using testing_support::LossRecorder;

// 200 short documents of a few repeated sentences: learnable in a few steps.
void write_corpus(const std::string& dir) {
  const char* sentences[] = {"the cat sat on the mat.\n", "a dog ate the bone.\n", "we like to read books.\n"};
  std::ofstream out(dir + "/tiny", std::ios::binary);
  for (int i = 0; i < 200; ++i) out << sentences[i % 3] << sentences[(i * 7) % 3] << "%\n";
}

TrainConfig tiny_language_config(const std::string& data_dir, const std::string& output) {
  TrainConfig c;
  c.model = "lm_tiny";
  c.model_config.vit.attention = models::ViTAttention::ConvNN;
  c.model_config.convnn.k = 4;
  c.model_config.vit.embed_dim = 32;
  c.model_config.vit.depth = 1;
  c.model_config.vit.num_heads = 2;
  c.model_config.vit.dropout = 0.1;  // resuming must restore the generator
  c.model_config.lm.context = 32;
  c.data.dataset = "fortunes";
  c.data.data_dir = data_dir;
  c.optimization.batch_size = 8;
  c.optimization.epochs = 2;
  c.optimization.warmup_epochs = 0.2;
  c.optimization.lr = 3e-3;
  c.optimization.smoothing = 0.0;
  c.run.output = output;
  c.run.experiment = "run";
  return c;
}

TEST(LanguageModelTraining, AShortRunLearnsTheCorpusAndItsCheckpointGenerates) {
  TempDir dir;
  write_corpus(dir.path().string());
  const auto config = tiny_language_config(dir.path().string(), dir.file("runs"));
  const auto result = train(config);
  ASSERT_FALSE(result.interrupted);
  // Chance is ln 256 = 5.5 nats per byte; the corpus is a few sentences (66 steps).
  EXPECT_LT(result.final_eval.loss, 3.0) << "validation loss after 2 epochs";
  EXPECT_GT(result.final_eval.top1, 50.0);
  EXPECT_EQ(result.final_eval.class_names.size(), 256u);

  const auto checkpoint = checkpoint::latest_checkpoint_path(result.run_dir);
  const auto stored = checkpoint::read_checkpoint_header(checkpoint).config;
  EXPECT_EQ(stored.model_config.num_classes, 256) << "the vocabulary comes from the data";
  auto model = make_model(stored, c10::Device(c10::kCPU));
  checkpoint::load_checkpoint(checkpoint, *model.module(), nullptr);
  const auto prompt = data::encode_bytes("the ").unsqueeze(0);
  const auto text = data::decode_bytes(
      models::generate(*model.get<models::LanguageModelImpl>(), prompt, 20, models::SamplingOptions{0.0, 0}, 0)[0]);
  EXPECT_EQ(text.substr(0, 4), "the ");
  EXPECT_NE(text.find(' ', 4), std::string::npos) << "greedy text of a trained model has words: " << text;
}

TEST(LanguageModelTraining, AResumedRunRepeatsTheUninterruptedLossTrajectory) {
  TempDir dir;
  write_corpus(dir.path().string());
  std::vector<double> whole, resumed;
  LossRecorder whole_losses(whole), resumed_losses(resumed);
  TrainHooks record;
  record.sinks.push_back(&whole_losses);
  const auto full = train(tiny_language_config(dir.path().string(), dir.file("a")), "", record);
  ASSERT_FALSE(full.interrupted);

  TrainHooks interrupted;
  interrupted.sinks.push_back(&resumed_losses);
  interrupted.max_steps = static_cast<int64_t>(whole.size() / 2) + 1;  // within the second epoch
  const auto config = tiny_language_config(dir.path().string(), dir.file("b"));
  ASSERT_TRUE(train(config, "", interrupted).interrupted);
  TrainHooks rest;
  rest.sinks = interrupted.sinks;
  const auto finished = train(config, checkpoint::latest_checkpoint_path(dir.file("b") + "/run"), rest);
  ASSERT_FALSE(finished.interrupted);
  ASSERT_EQ(resumed.size(), whole.size());
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(resumed[i], whole[i]) << "batch " << i;
  EXPECT_EQ(finished.final_eval.loss, full.final_eval.loss);
}

TEST(LanguageModelTraining, ModelsAndDataOfDifferentKindsAreRefused) {
  TempDir dir;
  auto image_model = tiny_language_config(dir.path().string(), dir.file("runs"));
  image_model.model = "vit_tiny";
  image_model.model_config = {};
  EXPECT_NE(error_of([&] { validate(image_model); }).find("model vit_tiny reads images: it cannot train on the text data set fortunes"),
            std::string::npos);
  auto image_data = tiny_language_config(dir.path().string(), dir.file("runs"));
  image_data.data.dataset = "fashion-mnist";
  image_data.data.data_dir.clear();
  EXPECT_NE(error_of([&] { validate(image_data); }).find("model lm_tiny is a language model: it trains on a text data set (fortunes), got dataset fashion-mnist"),
            std::string::npos);
  auto flip = tiny_language_config(dir.path().string(), dir.file("runs"));
  flip.augmentation.hflip = 0.5;
  EXPECT_NE(error_of([&] { validate(flip); }).find("hflip is an image option; dataset fortunes is text"),
            std::string::npos);
}

}  // namespace
}  // namespace convnn::train
