// The training config: JSON round trip, strict reading, and the checks of every value.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "convnn/train/config.h"
#include "data/fixtures.h"

namespace convnn::train {
namespace {

TEST(TrainConfig, JsonRoundTripKeepsEveryField) {
  TrainConfig c;
  c.model = "vit_tiny";
  c.model_config.attention = models::ViTAttention::ConvNN;
  c.model_config.patch_size = 4;
  c.optimizer = OptimizerKind::Sgd;
  c.nesterov = true;
  c.decay_on = DecayOn::Weights;
  c.precision = Precision::BFloat16;
  c.seed = 12345678901ULL;
  c.warmup_epochs = 0.5;
  const nlohmann::json json = c;
  const auto back = json.get<TrainConfig>();
  EXPECT_EQ(nlohmann::json(back), json);
  EXPECT_EQ(back.model_config.attention, models::ViTAttention::ConvNN);
  EXPECT_EQ(back.seed, 12345678901ULL);
}

TEST(TrainConfig, ReadingRejectsUnknownKeysAndWrongTypes) {
  const auto message = [](const char* text) {
    return testing::error_of([&] { nlohmann::json::parse(text).get<TrainConfig>(); });
  };
  EXPECT_NE(message(R"({"learning_rate": 0.1})").find("unknown option 'learning_rate'"), std::string::npos);
  EXPECT_NE(message(R"({"epochs": "ten"})").find("epochs must be an integer"), std::string::npos);
  EXPECT_NE(message(R"({"optimizer": "adam"})").find("optimizer must be one of adamw, sgd"), std::string::npos);
  EXPECT_NE(message(R"({"model_config": {"k": 1.5}})").find("k must be an integer"), std::string::npos);
}

TEST(TrainConfig, ValidateNamesTheOptionAndItsValue) {
  const auto message = [](auto change) {
    TrainConfig c;
    change(c);
    return testing::error_of([&] { validate(c); });
  };
  EXPECT_NE(message([](TrainConfig& c) { c.lr = -1; }).find("lr must be a positive finite number, got -1"),
            std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) { c.epochs = 0; }).find("epochs must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) { c.warmup_epochs = 400; }).find("warmup_epochs (400)"), std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) { c.smoothing = 1; }).find("smoothing must be in [0, 1)"), std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) { c.nesterov = true; }).find("nesterov needs the sgd optimizer"),
            std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) { c.dataset = "imagenet"; }).find("imagenet"), std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) { c.experiment = "a/b"; }).find("experiment must be a plain"),
            std::string::npos);
  EXPECT_EQ(message([](TrainConfig&) {}), "<no error>");
}

TEST(TrainConfig, ReadConfigNamesTheFile) {
  testing::TempDir dir;
  const auto missing = dir.file("missing.json");
  EXPECT_NE(testing::error_of([&] { read_config(missing); }).find(missing), std::string::npos);
  const auto broken = dir.file("broken.json");
  testing::write_file(broken, {'{', '"', 'l'});
  const auto message = testing::error_of([&] { read_config(broken); });
  EXPECT_NE(message.find(broken), std::string::npos);
  EXPECT_NE(message.find("not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace convnn::train
