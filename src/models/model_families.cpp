// The model families, one row each (registry.h, ModelFamilyRow): their names, the ModelConfig parts
// they read, their own rules and builders, their ConvNN layers, and how timm and `convnn compare`
// list them. Everything else that differs by family reads these rows.
#include "models/model_families.h"

#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "models/model_config_fields.h"
#include "util/enum_names.h"
#include "util/json_fields.h"

namespace convnn::models {
namespace {

using namespace model_fields;

std::string resnet_options_text() { return option_names(ResNetConfig{}, visit_resnet_fields); }
std::string vit_options_text() { return option_names(ViTConfig{}, visit_vit_fields); }

// The options a language model takes: the ViT's but patch_size and paper, and its own.
std::string language_options_text() {
  std::string names;
  ViTConfig vit;
  visit_vit_fields(vit, [&](const char* key, const auto&) {
    if (std::string_view(key) != "patch_size" && std::string_view(key) != "paper") names += std::string(key) + ", ";
  });
  return names + option_names(LanguageModelConfig{}, visit_lm_fields);
}

void check_resnet(const std::string&, const ModelConfig& c) {
  const auto& r = c.resnet;
  TORCH_CHECK(r.lambda >= 0.0 && r.lambda <= 1.0, "lambda must be in [0, 1], got ", r.lambda);
  TORCH_CHECK(r.padding >= 0, "padding must be non-negative, got ", r.padding);
  TORCH_CHECK(r.width >= 1, "width must be at least 1, got ", r.width);
}

// The transformer options the ViTs and the language models share.
void check_transformer(const ViTConfig& t) {
  model_fields::check_dropout(t.dropout, "dropout");
  model_fields::check_dropout(t.attention_dropout, "attention_dropout");
  model_fields::check_dropout(t.drop_path, "drop_path");
  for (const auto& [option, value] : {std::pair{"embed_dim", t.embed_dim}, std::pair{"depth", t.depth},
                                      std::pair{"num_heads", t.num_heads}, std::pair{"mlp_dim", t.mlp_dim}}) {
    TORCH_CHECK(!value || *value >= 1, option, " must be at least 1 (or unset: the preset's), got ", *value);
  }
}

void check_vit(const std::string&, const ModelConfig& c) {
  const auto& t = c.vit;
  check_transformer(t);
  TORCH_CHECK(t.patch_size >= 1, "patch_size must be at least 1, got ", t.patch_size);
  TORCH_CHECK(c.image_size % t.patch_size == 0, "image_size = ", c.image_size,
              " must be a multiple of patch_size = ", t.patch_size);
}

// A language model reads tokens: the image options and the ViT's image-only ones keep their
// defaults.
void check_language_model(const std::string& name, const ModelConfig& c) {
  const ModelConfig defaults;
  const auto why = " is not used by " + name + " (a language model reads tokens; its options are " +
                   language_options_text() + ")";
  TORCH_CHECK(c.in_channels == defaults.in_channels, "in_channels = ", c.in_channels, why);
  TORCH_CHECK(c.image_size == defaults.image_size, "image_size = ", c.image_size, why);
  TORCH_CHECK(c.vit.patch_size == defaults.vit.patch_size, "patch_size = ", c.vit.patch_size, why);
  TORCH_CHECK(!c.vit.paper, "paper = true", why);
  TORCH_CHECK(!c.lm.context || *c.lm.context >= 1, "context must be at least 1 (or unset: the preset's), got ",
              *c.lm.context);
  TORCH_CHECK(c.lm.num_kv_heads >= 0, "num_kv_heads must be 0 (num_heads) or positive, got ", c.lm.num_kv_heads);
  check_transformer(c.vit);
}

// The config as built: num_classes is the head's size, the model's own where it was unset.
ModelConfig as_built(ModelConfig config, int64_t num_classes) {
  config.num_classes = num_classes;
  return config;
}

Model build_resnet(const ModelEntry& entry, const ModelConfig& config) {
  ResNet net(resnet_options(entry.name, config));
  Model model(entry.name, as_built(config, net->options.num_classes()), torch::nn::AnyModule(net),
              [net](int64_t h, int64_t w) { return net->cost(h, w); });
  net->check_image_size(config.image_size, config.image_size);
  return model;
}

Model build_vit(const ModelEntry& entry, const ModelConfig& config) {
  VisionTransformer net(vit_options(entry.name, config));
  return Model(entry.name, as_built(config, net->options.num_classes()), torch::nn::AnyModule(net),
               [net](int64_t h, int64_t w) { return net->cost(h, w); });
}

Model build_language_model(const ModelEntry& entry, const ModelConfig& config) {
  LanguageModel net(language_model_options(entry.name, config));
  return Model(entry.name, as_built(config, net->options.vocab_size()), torch::nn::AnyModule(net),
               [net](int64_t, int64_t) { return net->cost(net->options.context()); });
}

std::vector<ModelFamilyRow> family_rows() {
  ModelFamilyRow resnet{ModelFamily::ResNet, "resnet", "ResNet", true, false, false, &resnet_options_text,
                        &check_resnet, &build_resnet, "layer", "conv", {"convnn", "branching"},
                        {{"padding", "it pads ConvNN's search in"},
                         {"strided_slots", "it gives the stride-2 3x3 convolutions to"}},
                        /*image_classifier=*/true, /*compare_random_candidates=*/true,
                        R"({"variants": {"": {"layer": "branching"}}, "out_indices": [0, 1, 2, 3, 4],
                            "first_conv": "conv1", "classifier": "fc", "feature_map": true,
                            "dynamic_img_size": false})"};
  ModelFamilyRow vit{ModelFamily::ViT, "vit", "ViT", false, true, false, &vit_options_text, &check_vit,
                     &build_vit, "attention", "mhsa", {"kvt", "convnn"}, {},
                     /*image_classifier=*/true, /*compare_random_candidates=*/false,
                     R"({"variants": {"_patch4": {"attention": "convnn", "patch_size": 4, "image_size": 32},
                                      "_patch16": {"attention": "convnn", "patch_size": 16, "image_size": 224}},
                         "out_indices": 3, "first_conv": "patch_embed", "classifier": "head",
                         "feature_map": false, "dynamic_img_size": true})"};
  ModelFamilyRow lm{ModelFamily::LanguageModel, "lm", "language", false, true, true, &language_options_text,
                    &check_language_model, &build_language_model, "attention", "mhsa", {"kvt", "convnn"}, {},
                    /*image_classifier=*/false, /*compare_random_candidates=*/false, /*timm=*/nullptr};
  return {resnet, vit, lm};
}

std::string joined_with_and(const std::vector<std::string>& items) {
  std::string text;
  for (size_t i = 0; i < items.size(); ++i) text += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return text;
}

}  // namespace

const std::vector<ModelFamilyRow>& model_families() {
  static const std::vector<ModelFamilyRow> rows = [] {
    auto all = family_rows();
    for (size_t i = 0; i < all.size(); ++i) {
      TORCH_INTERNAL_ASSERT(static_cast<size_t>(all[i].family) == i, "model_families: rows out of value order");
    }
    return all;
  }();
  return rows;
}

const ModelFamilyRow& model_family(ModelFamily family) { return model_families().at(static_cast<size_t>(family)); }

const char* to_string(ModelFamily family) { return model_family(family).name; }

ModelFamily parse_model_family(std::string_view name) {
  return model_families().at(convnn::detail::index_of_name(model_family_names(), name, "family")).family;
}

const std::vector<std::string>& model_family_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const auto& row : model_families()) all.emplace_back(row.name);
    return all;
  }();
  return names;
}

void to_json(nlohmann::json& json, const ModelFamilyRow& row) {
  json = {{"name", row.name},
          {"title", row.title},
          {"options", row.own_options()},
          {"layer_option", row.layer_option},
          {"baseline_layer", row.baseline_layer},
          {"convnn_layers", row.convnn_layers},
          {"image_classifier", row.image_classifier},
          {"compare_random_candidates", row.compare_random_candidates},
          {"timm", row.timm ? nlohmann::json::parse(row.timm) : nlohmann::json()}};
}

void check_family_options(const std::string& name, const ModelConfig& c) {
  const auto& row = model_family(model_entry(name).family);
  // The parts another family reads keep their defaults.
  const auto own = row.own_options();
  const auto title = [](ModelFamily family) { return model_family(family).title; };
  if (!row.reads_lm) check_family_unused(c.lm, visit_lm_fields, name, title(ModelFamily::LanguageModel), own);
  if (!row.reads_vit) check_family_unused(c.vit, visit_vit_fields, name, title(ModelFamily::ViT), own);
  if (!row.reads_resnet) check_family_unused(c.resnet, visit_resnet_fields, name, title(ModelFamily::ResNet), own);
  // The layer without ConvNN refuses ConvNN's options and the family's options for its ConvNN layers.
  const nlohmann::json given = c;
  const auto layer = given.at(row.layer_option).get<std::string>();
  if (layer == row.baseline_layer) {
    const auto with_baseline = std::string(" is not used by ") + name + " with " + row.layer_option + " " + layer;
    const auto convnn_layers = std::string(row.layer_option) + " " + joined_with_and(row.convnn_layers) + ")";
    check_unused(c.convnn, visit_convnn_fields,
                 with_baseline.substr(1) + " (ConvNN's options apply to " + convnn_layers);
    const nlohmann::json defaults = ModelConfig{};
    for (const auto& [option, what] : row.convnn_only_options) {
      const auto& value = given.at(option);
      TORCH_CHECK(value == defaults.at(option), option, " = ", convnn::detail::shown(value), with_baseline, " (",
                  what, " ", convnn_layers);
    }
  }
  row.check(name, c);
}

}  // namespace convnn::models
