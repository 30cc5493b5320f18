// The training config: JSON round trip, strict reading, and the checks of every value.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "convnn/config/train_config.h"
#include "data/fixtures.h"

namespace convnn::train {
namespace {

std::string message_of_validate(const TrainConfig& c) {
  return testing::error_of([&] { validate(c); });
}

TEST(TrainConfig, JsonRoundTripKeepsEveryField) {
  TrainConfig c;
  c.model = "vit_tiny";
  c.model_config.vit.attention = models::ViTAttention::ConvNN;
  c.model_config.vit.patch_size = 4;
  c.optimization.optimizer = OptimizerKind::Sgd;
  c.optimization.nesterov = true;
  c.optimization.decay_on = DecayOn::Weights;
  c.optimization.precision = Precision::BFloat16;
  c.run.seed = 12345678901ULL;
  c.optimization.warmup_epochs = 0.5;
  const nlohmann::json json = c;
  const auto back = json.get<TrainConfig>();
  EXPECT_EQ(nlohmann::json(back), json);
  EXPECT_EQ(back.model_config.vit.attention, models::ViTAttention::ConvNN);
  EXPECT_EQ(back.run.seed, 12345678901ULL);
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

TEST(TrainConfig, KeysAreTheFlagsAndPairsAreArrays) {
  TrainConfig c;
  c.optimization.beta1 = 0.8;
  c.augmentation.scale_min = 0.25;
  const nlohmann::json json = c;
  EXPECT_EQ(json.at("opt"), "adamw");
  EXPECT_EQ(json.at("sched"), "cosine");
  EXPECT_EQ(json.at("grad_accum_steps"), 1);
  EXPECT_EQ(json.at("opt_eps"), 1e-8);
  EXPECT_EQ(json.at("opt_betas"), nlohmann::json::array({0.8, 0.999}));
  EXPECT_EQ(json.at("scale"), nlohmann::json::array({0.25, 1.0}));
  EXPECT_EQ(json.at("ratio"), nlohmann::json::array({3.0 / 4.0, 4.0 / 3.0}));
  for (const char* former : {"optimizer", "schedule", "accum_steps", "eps", "beta1", "beta2", "scale_min",
                             "scale_max", "ratio_min", "ratio_max"}) {
    EXPECT_FALSE(json.contains(former)) << former;
  }
  const auto message = [](const char* text) {
    return testing::error_of([&] { nlohmann::json::parse(text).get<TrainConfig>(); });
  };
  EXPECT_NE(message(R"({"opt_betas": [0.9]})").find("opt_betas must be two numbers [first, second], got [0.9]"),
            std::string::npos);
  EXPECT_NE(message(R"({"scale": 0.5})").find("scale must be two numbers"), std::string::npos);
}

TEST(TrainConfig, FormerKeysStillReadAndNotBesideTheirCurrentOnes) {
  // A config.json written before the keys were the flags' names.
  const auto c = nlohmann::json::parse(R"({"optimizer": "sgd", "schedule": "constant", "accum_steps": 3,
      "eps": 1e-6, "beta1": 0.8, "scale_min": 0.5, "ratio_max": 2.0})").get<TrainConfig>();
  EXPECT_EQ(c.optimization.optimizer, OptimizerKind::Sgd);
  EXPECT_EQ(c.optimization.schedule, Schedule::Constant);
  EXPECT_EQ(c.optimization.accum_steps, 3);
  EXPECT_EQ(c.optimization.eps, 1e-6);
  // A pair's missing half keeps its value, as any key left out does.
  EXPECT_EQ(c.optimization.beta1, 0.8);
  EXPECT_EQ(c.optimization.beta2, OptimizationConfig{}.beta2);
  EXPECT_EQ(c.augmentation.scale_min, 0.5);
  EXPECT_EQ(c.augmentation.scale_max, AugmentationConfig{}.scale_max);
  EXPECT_EQ(c.augmentation.ratio_min, AugmentationConfig{}.ratio_min);
  EXPECT_EQ(c.augmentation.ratio_max, 2.0);
  const auto message = [](const char* text) {
    return testing::error_of([&] { nlohmann::json::parse(text).get<TrainConfig>(); });
  };
  EXPECT_NE(message(R"({"optimizer": "sgd", "opt": "adamw"})")
                .find("'optimizer' is the former name of 'opt'; give only 'opt'"),
            std::string::npos);
  EXPECT_NE(message(R"({"beta2": 0.99, "opt_betas": [0.9, 0.99]})")
                .find("'beta2' is the former name of 'opt_betas'; give only 'opt_betas'"),
            std::string::npos);
  EXPECT_NE(message(R"({"ratio_min": "wide"})").find("ratio_min must be a number, got \"wide\""),
            std::string::npos);
}

TEST(TrainConfig, TheCommandsPresentationIsNoPartOfTheConfigAndOlderFilesKeysAreDropped) {
  // How the command shows a run left the run's config; a config.json or checkpoint of an earlier
  // version holds it, and reads as before.
  const nlohmann::json json = TrainConfig{};
  for (const char* key : {"quiet", "plots", "log_interval"}) EXPECT_FALSE(json.contains(key)) << key;
  const auto older = nlohmann::json::parse(R"({"quiet": true, "plots": false, "log_interval": 7, "epochs": 3})");
  EXPECT_EQ(older.get<TrainConfig>().optimization.epochs, 3);
}

TEST(TrainConfig, ValidateNamesTheOptionAndItsValue) {
  const auto message = [](auto change) {
    TrainConfig c;
    change(c);
    return testing::error_of([&] { validate(c); });
  };
  EXPECT_NE(message([](TrainConfig& c) {
              c.optimization.lr = -1;
            }).find("lr must be a positive finite number, got -1"),
            std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) { c.optimization.epochs = 0; }).find("epochs must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) { c.optimization.warmup_epochs = 400; }).find("warmup_epochs (400)"),
            std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) { c.optimization.smoothing = 1; }).find("smoothing must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) {
              c.optimization.nesterov = true;
            }).find("nesterov needs the sgd optimizer"),
            std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) { c.data.dataset = "imagenet"; }).find("imagenet"), std::string::npos);
  EXPECT_NE(message([](TrainConfig& c) { c.run.experiment = "a/b"; }).find("experiment must be a plain"),
            std::string::npos);
  EXPECT_EQ(message([](TrainConfig&) {}), "<no error>");
}

TEST(TrainConfig, UnsetOptionsAreNullInJsonAndTheRecipeFillsThem) {
  const nlohmann::json json = TrainConfig{};
  for (const char* key : {"image_size", "val_resize", "crop_padding", "hflip", "recipe", "rand_augment",
                          "color_jitter", "reprob", "mixup", "cutmix"}) {
    EXPECT_TRUE(json.at(key).is_null()) << key;
  }
  EXPECT_TRUE(json.at("model_config").at("embed_dim").is_null());
  const auto resolved = apply_recipe(TrainConfig{});  // fashion-mnist: no recipe, flips
  EXPECT_EQ(resolved.augmentation.recipe, Recipe::None);
  EXPECT_EQ(resolved.augmentation.hflip, 0.5);
  EXPECT_EQ(resolved.augmentation.mixup, 0.0);
  EXPECT_FALSE(resolved.augmentation.crop_padding.has_value());  // from the loaded images' size
  EXPECT_TRUE(nlohmann::json(resolved).at("crop_padding").is_null());
}

// config.json files and checkpoints written before the options were optional held -1 or 0 for
// "the recipe's / the data set's / the preset's"; they still read, as unset.
TEST(TrainConfig, OlderFilesSentinelsReadAsUnset) {
  const auto old =
      nlohmann::json::parse(R"({"image_size": 0, "val_resize": 0, "crop_padding": -1, "hflip": -1,
      "rand_augment": -1, "color_jitter": -1, "reprob": -1, "mixup": -1, "cutmix": 0.5,
      "model": "vit_tiny", "model_config": {"embed_dim": 0, "depth": 2, "num_heads": 0, "mlp_dim": 0}})");
  const auto c = old.get<TrainConfig>();
  EXPECT_FALSE(c.data.image_size || c.data.val_resize || c.augmentation.crop_padding ||
               c.augmentation.hflip || c.augmentation.rand_augment || c.augmentation.color_jitter ||
               c.augmentation.reprob || c.augmentation.mixup);
  EXPECT_EQ(c.augmentation.cutmix, 0.5);  // a value, not a sentinel
  EXPECT_FALSE(c.model_config.vit.embed_dim || c.model_config.vit.num_heads || c.model_config.vit.mlp_dim);
  EXPECT_EQ(c.model_config.vit.depth, 2);
  EXPECT_EQ(message_of_validate(c), "<no error>");
}

TEST(TrainConfig, AGivenOptionalValueIsCheckedAndTheMessageSaysWhatUnsetMeans) {
  TrainConfig c;
  c.augmentation.hflip = -1.0;
  EXPECT_NE(message_of_validate(c).find(
                "hflip must be a probability in [0, 1] (or unset: the data set's default), got -1"),
            std::string::npos);
  c = TrainConfig{};
  c.augmentation.crop_padding = -2;
  EXPECT_NE(
      message_of_validate(c).find("crop_padding must be in [0, 1024] (0: off) (or unset: the data set's "
                                  "default), got -2"),
      std::string::npos);
  c = TrainConfig{};
  c.data.dataset = "imagefolder";
  c.data.data_dir = "/data";
  c.data.image_size = 0;
  EXPECT_NE(message_of_validate(c).find("image_size must be >= 1 (or unset: 224), got 0"), std::string::npos);
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
