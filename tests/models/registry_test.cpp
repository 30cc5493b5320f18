// Every registry model with every layer / attention choice, at small resolution: one training
// step (forward, backward, optimiser), eval mode, torch::save / torch::load round trip and
// pretty_print; plus the config's JSON form and the registry's errors.
#include "convnn/models/registry.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "convnn/nn/modules/convnn.h"

namespace {

using namespace convnn::models;

struct Case {
  std::string label;
  std::string name;
  ModelConfig config;
};

// GoogleTest prints a parameter by its label, not its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

// Small but complete: 32 px, 10 classes, every stage and block present. ResNets keep their real
// block counts with narrower stages; ViTs keep their width and heads with 2 blocks of 8 px patches
// (17 tokens). The real presets' sizes are asserted in resnet_test.cpp and vit_test.cpp.
ModelConfig small_config(const std::string& name) {
  ModelConfig config;
  config.image_size = 32;
  config.num_classes = 10;
  if (model_entry(name).family == ModelFamily::ResNet) {
    config.resnet.small_stem = true;
    config.resnet.width = 16;
  } else {
    config.vit.patch_size = 8;
    config.vit.depth = 2;
  }
  return config;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& name : model_names()) {
    // The image models; the language models read tokens (language_model_test.cpp).
    if (model_entry(name).family == ModelFamily::LanguageModel) continue;
    const bool resnet = model_entry(name).family == ModelFamily::ResNet;
    for (int choice = 0; choice < 3; ++choice) {
      auto config = small_config(name);
      std::string label = name + "_";
      if (resnet) {
        config.resnet.layer = static_cast<ResNetLayer>(choice);
        label += to_string(config.resnet.layer);
      } else {
        config.vit.attention = static_cast<ViTAttention>(choice);
        label += to_string(config.vit.attention);
      }
      cases.push_back({label, name, config});
    }
  }
  // The paper's variants: random candidates in the ResNet, the authors' ViT.
  auto random = small_config("resnet50");
  random.resnet.layer = ResNetLayer::Branching;
  random.convnn.num_candidates = 32;
  cases.push_back({"resnet50_branching_random", "resnet50", random});
  auto paper = small_config("vit_base");
  paper.vit.attention = ViTAttention::ConvNN;
  paper.vit.paper = true;
  paper.vit.dropout = 0.1;
  paper.vit.attention_dropout = 0.1;
  paper.vit.drop_path = 0.1;
  cases.push_back({"vit_base_convnn_paper", "vit_base", paper});
  return cases;
}

class RegistryModel : public ::testing::TestWithParam<Case> {};

TEST_P(RegistryModel, TrainsOneStep) {
  const auto& c = GetParam();
  torch::manual_seed(0);
  auto model = build_model(c.name, c.config);
  auto module = model.module();
  module->train();
  const auto images = torch::randn({2, c.config.in_channels, 32, 32});
  const auto labels = torch::tensor({1, 7});
  const auto logits = model(images);
  ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{2, 10}));
  const auto loss = torch::nn::functional::cross_entropy(logits, labels);
  ASSERT_TRUE(std::isfinite(loss.item<double>()));
  loss.backward();
  for (const auto& p : module->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    ASSERT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
  const auto before = module->parameters().front().detach().clone();
  torch::optim::SGD(module->parameters(), torch::optim::SGDOptions(0.1)).step();
  EXPECT_FALSE(torch::equal(before, module->parameters().front()));
}

TEST_P(RegistryModel, EvalIsDeterministicAndSaveLoadRoundTrips) {
  const auto& c = GetParam();
  auto model = build_model(c.name, c.config);
  auto fresh = build_model(c.name, c.config);
  std::stringstream buffer;
  torch::save(model.module(), buffer);
  auto target = fresh.module();  // torch::load takes the module pointer by reference
  torch::load(target, buffer);
  model.module()->eval();
  fresh.module()->eval();
  torch::NoGradGuard no_grad;
  const auto images = torch::randn({2, c.config.in_channels, 32, 32});
  const auto expected = model(images);
  EXPECT_TRUE(torch::equal(model(images), expected));
  EXPECT_TRUE(torch::equal(fresh(images), expected));
}

TEST_P(RegistryModel, PrettyPrintShowsTheModelAndItsLayers) {
  const auto& c = GetParam();
  std::ostringstream stream;
  stream << *build_model(c.name, c.config).module();
  const auto text = stream.str();
  const bool resnet = model_entry(c.name).family == ModelFamily::ResNet;
  EXPECT_NE(text.find(resnet ? "convnn::models::ResNet(depth=" : "convnn::models::VisionTransformer("),
            std::string::npos)
      << text;
  const char* layer = resnet
                          ? (c.config.resnet.layer == ResNetLayer::ConvNN      ? "convnn::ConvNN2d("
                             : c.config.resnet.layer == ResNetLayer::Branching ? "convnn::BranchingConv2d("
                                                                               : "torch::nn::Conv2d(")
                          : (c.config.vit.attention == ViTAttention::MHSA ? "convnn::models::SelfAttention("
                                                                          : "convnn::ConvNNAttention(");
  EXPECT_NE(text.find(layer), std::string::npos) << text;
}

TEST_P(RegistryModel, CostCountsEveryParameter) {
  const auto& c = GetParam();
  const auto model = build_model(c.name, c.config);
  const auto report = model.cost();
  EXPECT_EQ(report.parameters(), model.parameter_count());
  int64_t staged = 0;
  for (const auto& stage : report.stages()) staged += stage.parameters;
  EXPECT_EQ(staged, model.parameter_count());
  EXPECT_GT(report.total().macs, 0);
}

INSTANTIATE_TEST_SUITE_P(AllModels, RegistryModel, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.label; });

// A full-width ResNet-50 with ConvNN layers at 32 px, as the paper's ConvNN-only model.
TEST(Registry, FullWidthResNet50WithConvNNTrainsOneStep) {
  ModelConfig config;
  config.resnet.layer = ResNetLayer::ConvNN;
  config.resnet.small_stem = true;
  config.image_size = 32;
  config.num_classes = 10;
  auto model = build_model("resnet50", config);
  model.module()->train();
  const auto loss =
      torch::nn::functional::cross_entropy(model(torch::randn({2, 3, 32, 32})), torch::tensor({0, 3}));
  loss.backward();
  const auto* first = model.get<ResNetImpl>()->slot_layers().front()->as<convnn::nn::ConvNN2d>();
  EXPECT_TRUE(first->kernel.grad().defined());
  EXPECT_GT(first->kernel.grad().abs().sum().item<double>(), 0.0);
}

// Cloneable::clone rebuilds the layers in reset() and copies every parameter and buffer: the layers
// held behind AnyModule (ResNet slots, ViT attention) must come out as deep copies too.
TEST(Registry, CloneIsADeepCopyWithIdenticalOutputs) {
  for (const auto& c : all_cases()) {
    if (c.label != "resnet18_branching" && c.label != "vit_tiny_convnn") continue;
    auto model = build_model(c.name, c.config);
    auto copy = model.module()->clone();
    model.module()->eval();
    copy->eval();
    torch::NoGradGuard no_grad;
    const auto images = torch::randn({2, 3, 32, 32});
    const auto expected = model(images);
    const auto resnet = std::dynamic_pointer_cast<ResNetImpl>(copy);
    const auto vit = std::dynamic_pointer_cast<VisionTransformerImpl>(copy);
    ASSERT_TRUE(resnet || vit) << c.label;
    EXPECT_TRUE(torch::equal(resnet ? resnet->forward(images) : vit->forward(images), expected)) << c.label;
    for (auto& p : copy->parameters()) p.zero_();
    EXPECT_TRUE(torch::equal(model(images), expected)) << c.label << ": the clone shares parameters";
  }
}

TEST(Registry, ConfigJsonRoundTrip) {
  ModelConfig config;
  config.num_classes = 100;
  config.convnn.k = 16;
  config.convnn.num_candidates = 32;
  config.convnn.similarity = convnn::Similarity::Dot;
  config.resnet.layer = ResNetLayer::Branching;
  config.resnet.lambda = 0.25;
  config.vit.position_embedding = PositionEmbedding::Sinusoidal;
  config.vit.drop_path = 0.1;
  const nlohmann::json json = config;
  EXPECT_EQ(json.at("similarity"), "dot");
  EXPECT_EQ(json.at("layer"), "branching");
  EXPECT_TRUE(json.at("rho").is_null());
  const auto back = json.get<ModelConfig>();
  EXPECT_EQ(nlohmann::json(back), json);
  EXPECT_FALSE(back.convnn.rho.has_value());
  EXPECT_EQ(back.convnn.similarity, convnn::Similarity::Dot);
  // A subset of the keys is a valid config: the rest keep their defaults.
  const auto partial = nlohmann::json{{"layer", "convnn"}, {"k", 4}}.get<ModelConfig>();
  EXPECT_EQ(partial.resnet.layer, ResNetLayer::ConvNN);
  EXPECT_EQ(partial.convnn.k, 4);
  EXPECT_FALSE(partial.num_classes.has_value()) << "unset: the model's own";
}

void expect_error_mentions(const std::function<void()>& f, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "expected a c10::Error";
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    for (const auto& word : words) EXPECT_NE(message.find(word), std::string::npos) << message;
  }
}

TEST(Registry, UnsetNumClassesIsTheModelsOwnHeadAndTheBuiltConfigSaysIt) {
  // A language model reads bytes: its vocabulary is 256 unless given; the image models keep
  // ImageNet's 1000 classes. The built model's config holds the size it was built with.
  auto lm = build_model("lm_tiny", ModelConfig{});
  EXPECT_EQ(lm.config().num_classes, 256);
  EXPECT_EQ(lm.forward(at::zeros({1, 3}, at::kLong)).size(-1), 256);
  EXPECT_EQ(language_model_options("lm_tiny", ModelConfig{}).vocab_size(), 256);
  EXPECT_EQ(build_model("resnet18", ModelConfig{}).config().num_classes, 1000);
  EXPECT_EQ(vit_options("vit_tiny", ModelConfig{}).num_classes(), 1000);
  ModelConfig given;
  given.num_classes = 50;
  EXPECT_EQ(language_model_options("lm_tiny", given).vocab_size(), 50);
  EXPECT_EQ(build_model("lm_tiny", given).config().num_classes, 50);
  given.num_classes = 0;
  expect_error_mentions([&] { build_model("lm_tiny", given); }, {"num_classes must be at least 1, got 0"});
}

TEST(Registry, ErrorsNameTheOptionTheValueAndTheRule) {
  expect_error_mentions([] { build_model("resnet99"); },
                        {"model must be one of resnet18, resnet34, resnet50, vit_tiny, vit_small, vit_base, vit_large",
                         "got 'resnet99'"});
  expect_error_mentions([] { nlohmann::json{{"kk", 3}}.get<ModelConfig>(); }, {"unknown option", "kk"});
  expect_error_mentions(
      [] {
        nlohmann::json{{"layer", "conv3"}}.get<ModelConfig>();
      },
      {"layer", "conv3", "branching"});
  expect_error_mentions([] { nlohmann::json{{"k", "nine"}}.get<ModelConfig>(); }, {"k", "integer", "nine"});
  ModelConfig config;
  config.convnn.k = 0;
  expect_error_mentions([&] { build_model("resnet18", config); }, {"k", "at least 1", "0"});
  config = {};
  config.convnn.num_candidates = 4;
  expect_error_mentions([&] { build_model("resnet18", config); }, {"k = 9", "num_candidates = 4"});
  config = {};
  config.resnet.layer = ResNetLayer::ConvNN;
  expect_error_mentions([&] { build_model("vit_tiny", config); }, {"layer = convnn", "ResNet"});
  config = {};
  config.vit.attention = ViTAttention::KVT;
  expect_error_mentions([&] { build_model("resnet18", config); }, {"attention = kvt", "ViT"});
  config = {};
  config.vit.dropout = 1.0;
  expect_error_mentions([&] { build_model("vit_tiny", config); }, {"dropout", "[0, 1)"});
  config = {};
  config.vit.embed_dim = 0;
  expect_error_mentions([&] { build_model("vit_tiny", config); },
                        {"embed_dim", "at least 1", "preset's", "0"});
}

// Each family's options belong to it: one given to the other family is an error naming it, not
// an option silently ignored (a ResNet has no dropout).
TEST(Registry, AnOptionOfTheOtherFamilyIsRefusedByName) {
  ModelConfig config;
  config.vit.dropout = 0.3;
  expect_error_mentions(
      [&] { build_model("resnet18", config); },
      {"dropout = 0.3 applies to ViT models only; resnet18's own options are layer, lambda, "
       "padding, small_stem, width and strided_slots"});
  config = {};
  config.resnet.width = 32;
  expect_error_mentions([&] { build_model("vit_tiny", config); },
                        {"width = 32 applies to ResNet models only", "patch_size", "drop_path"});
  config = {};
  config.vit.depth = 2;
  expect_error_mentions([&] { build_model("resnet18", config); }, {"depth = 2 applies to ViT models only"});
}

// Proves that ConvNN's options given to a model that does not use them (a ResNet of plain
// convolutions, a ViT of softmax attention) are refused by name rather than silently ignored: a
// config's k = 1e8 or padding = 1e5 used to pass unnoticed.
TEST(Registry, ConvNNOptionsAModelDoesNotUseAreRefusedByName) {
  ModelConfig config;
  config.convnn.k = 100000000;
  expect_error_mentions([&] { build_model("resnet18", config); },
                        {"k = 100000000 is not used by resnet18 with layer conv"});
  config = {};
  config.resnet.padding = 100000;
  expect_error_mentions([&] { build_model("resnet18", config); },
                        {"padding = 100000 is not used by resnet18 with layer conv"});
  config = {};
  config.convnn.similarity = convnn::Similarity::Dot;
  expect_error_mentions([&] { build_model("vit_tiny", config); },
                        {"similarity = dot is not used by vit_tiny with attention mhsa"});
  config.vit.attention = ViTAttention::ConvNN;
  EXPECT_NO_THROW(validate("vit_tiny", config));
}

// The registry is one table: the names, the families and the builders all come from its rows, and
// every other list (convnn info --list, compare's choices, Python's create_model, timm's names)
// reads it (python/tests/test_models.py compares them).
TEST(Registry, IsOneTableOfNamedRows) {
  const auto& entries = model_entries();
  std::vector<std::string> names;
  for (const auto& entry : entries) {
    names.push_back(entry.name);
    EXPECT_EQ(&model_entry(entry.name), &entry) << entry.name;
    // The preset is the family's options; the builder builds that family's module.
    EXPECT_EQ(std::holds_alternative<ResNetOptions>(entry.preset), entry.family == ModelFamily::ResNet) << entry.name;
    const nlohmann::json row = entry;
    EXPECT_EQ(row.at("name"), entry.name);
    EXPECT_EQ(row.at("family"), to_string(entry.family));
    EXPECT_EQ(parse_model_family(row.at("family").get<std::string>()), entry.family);
  }
  EXPECT_EQ(names, model_names());
  EXPECT_EQ(names, (std::vector<std::string>{"resnet18", "resnet34", "resnet50", "vit_tiny", "vit_small", "vit_base",
                                             "vit_large", "lm_tiny", "lm_small"}));
  EXPECT_EQ(model_names(ModelFamily::ViT),
            (std::vector<std::string>{"vit_tiny", "vit_small", "vit_base", "vit_large"}));
  EXPECT_EQ(model_family_names(), (std::vector<std::string>{"resnet", "vit", "lm"}));
  EXPECT_EQ(nlohmann::json(model_entry("lm_tiny")).at("preset"),
            (nlohmann::json{{"embed_dim", 128}, {"depth", 4}, {"num_heads", 4}, {"mlp_dim", 512}, {"context", 256}}));
  EXPECT_EQ(nlohmann::json(model_entry("resnet50")).at("preset"), (nlohmann::json{{"depth", 50}}));
  EXPECT_EQ(nlohmann::json(model_entry("vit_large")).at("preset"),
            (nlohmann::json{{"embed_dim", 1024}, {"depth", 24}, {"num_heads", 16}, {"mlp_dim", 4096}}));
  expect_error_mentions([] { model_entry("vit_huge"); }, {"model must be one of", "vit_large", "'vit_huge'"});
  expect_error_mentions([] { resnet_options("vit_tiny", {}); }, {"vit_tiny is not a ResNet"});
  expect_error_mentions([] { parse_model_family("convnext"); }, {"family", "resnet, vit", "convnext"});
}

// A family is one row: its names, the parts it reads, its layer without ConvNN (which refuses
// ConvNN's options and the family's options for its ConvNN layers), its builder and timm's listing
// all come from model_families(), for every family alike.
TEST(Registry, EachFamilyIsOneRowThatItsRulesBuildersAndListingsFollow) {
  const auto& rows = model_families();
  std::vector<std::string> names;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    SCOPED_TRACE(row.name);
    names.emplace_back(row.name);
    EXPECT_EQ(static_cast<size_t>(row.family), i);
    EXPECT_EQ(&model_family(row.family), &row);
    EXPECT_EQ(parse_model_family(row.name), row.family);
    const auto family_models = model_names(row.family);
    ASSERT_FALSE(family_models.empty());
    const auto& model = family_models.front();
    // A family's layer without ConvNN refuses a ConvNN option and each ConvNN-only option by name.
    const nlohmann::json defaults = ModelConfig{};
    nlohmann::json baseline = defaults;
    baseline[row.layer_option] = row.baseline_layer;
    baseline["k"] = 5;
    expect_error_mentions([&] { validate(model, baseline.get<ModelConfig>()); },
                          {"k = 5 is not used by " + model + " with " + row.layer_option + " " + row.baseline_layer});
    for (const auto& [option, what] : row.convnn_only_options) {
      nlohmann::json given = defaults;
      given[row.layer_option] = row.baseline_layer;
      given[option] = defaults.at(option).is_boolean() ? nlohmann::json(true) : nlohmann::json(7);
      expect_error_mentions([&] { validate(model, given.get<ModelConfig>()); },
                            {option + " = ", "is not used by " + model, what});
    }
    // Each ConvNN layer takes ConvNN's options.
    for (const auto& layer : row.convnn_layers) {
      nlohmann::json given = defaults;
      given[row.layer_option] = layer;
      given["k"] = 5;
      EXPECT_NO_THROW(validate(model, given.get<ModelConfig>())) << layer;
    }
    // timm lists the image classifiers, each variant's defaults a valid config of the family's models.
    const nlohmann::json json = row;
    EXPECT_EQ(json.at("name"), row.name);
    EXPECT_EQ(json.at("timm").is_null(), !row.image_classifier);
    if (!row.image_classifier) continue;
    ASSERT_FALSE(json.at("timm").at("variants").empty());
    for (const auto& [suffix, variant] : json.at("timm").at("variants").items()) {
      nlohmann::json given = defaults;
      given.update(variant);
      EXPECT_NO_THROW(validate(model, given.get<ModelConfig>())) << suffix;
    }
    for (const char* key : {"out_indices", "first_conv", "classifier", "feature_map", "dynamic_img_size"}) {
      EXPECT_TRUE(json.at("timm").contains(key)) << key;
    }
  }
  EXPECT_EQ(names, model_family_names());
}

// vit_large is one row: ViT-L/16 with plain attention at 224 px and 1000 classes has the parameters
// of timm's vit_large_patch16_224.
TEST(Registry, VitLargeHasTimmsParameterCount) {
  const auto model = build_model("vit_large");
  EXPECT_EQ(model.parameter_count(), 304'326'632);
  const auto& o = model.get<VisionTransformerImpl>()->options;
  EXPECT_EQ(o.embed_dim(), 1024);
  EXPECT_EQ(o.depth(), 24);
  EXPECT_EQ(o.num_heads(), 16);
  EXPECT_EQ(o.patch_size(), 16);
  EXPECT_EQ(model.get<VisionTransformerImpl>()->blocks->size(), 24u);
}

}  // namespace
