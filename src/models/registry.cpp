#include "convnn/models/registry.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>
#include <type_traits>
#include <utility>

#include "util/enum_names.h"
#include "util/json_fields.h"

namespace convnn::models {
namespace {

constexpr detail::NameTable<ModelFamily, 3> kFamilies{
    {{"resnet", ModelFamily::ResNet}, {"vit", ModelFamily::ViT}, {"lm", ModelFamily::LanguageModel}}};

// Each part's fields, in the order of its struct: the one list that both JSON directions and the
// family check follow.
const auto visit_convnn_fields = [](auto& c, auto&& visit) {
  visit("k", c.k);
  visit("num_candidates", c.num_candidates);
  visit("similarity", c.similarity);
  visit("rho", c.rho);
  visit("aggregation", c.aggregation);
};
const auto visit_resnet_fields = [](auto& c, auto&& visit) {
  visit("layer", c.layer);
  visit("lambda", c.lambda);
  visit("padding", c.padding);
  visit("small_stem", c.small_stem);
  visit("width", c.width);
  visit("strided_slots", c.strided_slots);
};
const auto visit_vit_fields = [](auto& c, auto&& visit) {
  visit("patch_size", c.patch_size);
  visit("attention", c.attention);
  visit("paper", c.paper);
  visit("position_embedding", c.position_embedding);
  visit("embed_dim", c.embed_dim);
  visit("depth", c.depth);
  visit("num_heads", c.num_heads);
  visit("mlp_dim", c.mlp_dim);
  visit("dropout", c.dropout);
  visit("attention_dropout", c.attention_dropout);
  visit("drop_path", c.drop_path);
};
const auto visit_lm_fields = [](auto& c, auto&& visit) {
  visit("context", c.context);
  visit("num_kv_heads", c.num_kv_heads);
};
// The model's JSON is flat (the keys of `convnn info` and Python's create_model).
const auto visit_model_fields = [](auto& c, auto&& visit) {
  visit("num_classes", c.num_classes);
  visit("in_channels", c.in_channels);
  visit("image_size", c.image_size);
  visit_convnn_fields(c.convnn, visit);
  visit_resnet_fields(c.resnet, visit);
  visit_vit_fields(c.vit, visit);
  visit_lm_fields(c.lm, visit);
};

// Enums travel by name (src/util/json_fields.h).
struct ModelEnums {
  std::string name(Similarity v) const { return to_string(v); }
  std::string name(nn::Rho v) const { return nn::to_string(v); }
  std::string name(nn::Aggregation v) const { return nn::to_string(v); }
  std::string name(ResNetLayer v) const { return to_string(v); }
  std::string name(ViTAttention v) const { return to_string(v); }
  std::string name(PositionEmbedding v) const { return to_string(v); }
  Similarity parse(const std::string& s, Similarity*) const { return parse_similarity(s); }
  nn::Rho parse(const std::string& s, nn::Rho*) const { return nn::parse_rho(s); }
  nn::Aggregation parse(const std::string& s, nn::Aggregation*) const { return nn::parse_aggregation(s); }
  ResNetLayer parse(const std::string& s, ResNetLayer*) const { return parse_resnet_layer(s); }
  ViTAttention parse(const std::string& s, ViTAttention*) const { return parse_vit_attention(s); }
  PositionEmbedding parse(const std::string& s, PositionEmbedding*) const {
    return parse_position_embedding(s);
  }
};

void check_dropout(double p, const char* option) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, option, " must be in [0, 1), got ", p);
}

// Options the model does not use keep their defaults: one given is an error rather than silently
// ignored. Compared as JSON, so that the message names the option; `why` ends it.
template <typename Part, typename VisitFields>
void check_unused(const Part& given, VisitFields visit_fields, const std::string& why) {
  const auto json_given = detail::config_to_json(given, visit_fields, ModelEnums{});
  const auto json_default = detail::config_to_json(Part{}, visit_fields, ModelEnums{});
  for (const auto& item : json_default.items()) {
    const auto& value = json_given.at(item.key());
    const auto shown = value.is_string() ? value.template get<std::string>() : detail::shown(value);
    TORCH_CHECK(value == item.value(), item.key(), " = ", shown, " ", why);
  }
}

// The other family's options keep their defaults.
template <typename FamilyConfig, typename VisitFields>
void check_family_unused(const FamilyConfig& given, VisitFields visit_fields, const std::string& name,
                         const char* family, const std::string& options_of_name) {
  check_unused(given, visit_fields,
               std::string("applies to ") + family + " models only; " + name + "'s own options are " + options_of_name);
}

// "a, b and c": the options of a family, for messages.
template <typename FamilyConfig, typename VisitFields>
std::string option_names(const FamilyConfig& config, VisitFields visit_fields) {
  std::vector<std::string> keys;
  visit_fields(config, [&](const char* key, const auto&) { keys.emplace_back(key); });
  std::string text;
  for (size_t i = 0; i < keys.size(); ++i)
    text += (i == 0 ? "" : i + 1 == keys.size() ? " and " : ", ") + keys[i];
  return text;
}

// Files written before the options were optional hold 0 for "the preset's".
nlohmann::json without_legacy_zeros(nlohmann::json json) {
  if (!json.is_object()) return json;
  for (const char* key : {"embed_dim", "depth", "num_heads", "mlp_dim"}) {
    if (json.contains(key) && json[key].is_number_integer() && json[key].get<int64_t>() == 0)
      json[key] = nullptr;
  }
  return json;
}

// The options a language model takes: the ViT's but patch_size and paper, and its own.
std::string language_option_names() {
  std::string names;
  ViTConfig vit;
  visit_vit_fields(vit, [&](const char* key, const auto&) {
    if (std::string_view(key) != "patch_size" && std::string_view(key) != "paper") names += std::string(key) + ", ";
  });
  return names + option_names(LanguageModelConfig{}, visit_lm_fields);
}

// A language model reads tokens: the image options and the ViT's image-only ones keep their
// defaults.
void check_language_model(const std::string& name, const ModelConfig& c) {
  const ModelConfig defaults;
  const auto why = " is not used by " + name + " (a language model reads tokens; its options are " +
                   language_option_names() + ")";
  TORCH_CHECK(c.in_channels == defaults.in_channels, "in_channels = ", c.in_channels, why);
  TORCH_CHECK(c.image_size == defaults.image_size, "image_size = ", c.image_size, why);
  TORCH_CHECK(c.vit.patch_size == defaults.vit.patch_size, "patch_size = ", c.vit.patch_size, why);
  TORCH_CHECK(!c.vit.paper, "paper = true", why);
  TORCH_CHECK(!c.lm.context || *c.lm.context >= 1, "context must be at least 1 (or unset: the preset's), got ",
              *c.lm.context);
  TORCH_CHECK(c.lm.num_kv_heads >= 0, "num_kv_heads must be 0 (num_heads) or positive, got ", c.lm.num_kv_heads);
}

}  // namespace

void to_json(nlohmann::json& json, const ModelConfig& config) {
  json = detail::config_to_json(config, visit_model_fields, ModelEnums{});
}

void from_json(const nlohmann::json& json, ModelConfig& config) {
  detail::config_from_json(without_legacy_zeros(json), config, "model config", visit_model_fields,
                           ModelEnums{});
}

namespace {

Model build_resnet(const ModelEntry& entry, const ModelConfig& config) {
  ResNet net(resnet_options(entry.name, config));
  Model model(entry.name, config, torch::nn::AnyModule(net),
              [net](int64_t h, int64_t w) { return net->cost(h, w); });
  net->check_image_size(config.image_size, config.image_size);
  return model;
}

Model build_vit(const ModelEntry& entry, const ModelConfig& config) {
  VisionTransformer net(vit_options(entry.name, config));
  return Model(entry.name, config, torch::nn::AnyModule(net),
               [net](int64_t h, int64_t w) { return net->cost(h, w); });
}

Model build_language_model(const ModelEntry& entry, const ModelConfig& config) {
  LanguageModel net(language_model_options(entry.name, config));
  return Model(entry.name, config, torch::nn::AnyModule(net),
               [net](int64_t, int64_t) { return net->cost(net->options.context()); });
}

ModelEntry language_model(std::string name, LanguageModelOptions preset) {
  return {std::move(name), ModelFamily::LanguageModel, std::move(preset), &build_language_model};
}

ModelEntry resnet(std::string name, int64_t depth) {
  return {std::move(name), ModelFamily::ResNet, ResNetOptions(depth), &build_resnet};
}

ModelEntry vit(std::string name, VisionTransformerOptions preset) {
  return {std::move(name), ModelFamily::ViT, std::move(preset), &build_vit};
}

// The transformer sizes a ViT or language model takes from ViTConfig over its preset's, checked
// together: one of the two may be the preset's, which the user never typed, and the message says
// which.
template <typename Options>
void apply_transformer_sizes(Options& o, const ViTConfig& t, const std::string& name) {
  if (t.embed_dim) o.embed_dim(*t.embed_dim);
  if (t.depth) o.depth(*t.depth);
  if (t.num_heads) o.num_heads(*t.num_heads);
  if (t.mlp_dim) o.mlp_dim(*t.mlp_dim);
  const auto preset_note = [&name](const std::optional<int64_t>& given) {
    return given ? std::string() : " (" + name + "'s)";
  };
  TORCH_CHECK(o.embed_dim() % o.num_heads() == 0, "num_heads = ", o.num_heads(), preset_note(t.num_heads),
              " must divide embed_dim = ", o.embed_dim(), preset_note(t.embed_dim));
}

// The KVT / ConvNN attention of the transformer families: the paper's ViT choices where unset.
nn::ConvNNAttentionOptions transformer_attention(const ConvNNConfig& v, int64_t embed_dim, int64_t num_heads) {
  return nn::ConvNNAttentionOptions(embed_dim, num_heads, v.k)
      .num_candidates(v.num_candidates)
      .similarity(v.similarity.value_or(Similarity::ScaledDot))
      .rho(v.rho.value_or(nn::Rho::Softmax))
      .aggregation(v.aggregation.value_or(nn::Aggregation::Depthwise));
}

}  // namespace

const char* to_string(ModelFamily family) { return detail::name_of(kFamilies, family); }

ModelFamily parse_model_family(std::string_view name) { return detail::parse_name(kFamilies, name, "family"); }

const std::vector<std::string>& model_family_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const auto& [name, family] : kFamilies) all.emplace_back(name);
    return all;
  }();
  return names;
}

// Adding a model is adding its row.
const std::vector<ModelEntry>& model_entries() {
  static const std::vector<ModelEntry> entries{
      resnet("resnet18", 18),
      resnet("resnet34", 34),
      resnet("resnet50", 50),
      vit("vit_tiny", VisionTransformerOptions::tiny()),
      vit("vit_small", VisionTransformerOptions::small()),
      vit("vit_base", VisionTransformerOptions::base()),
      vit("vit_large", VisionTransformerOptions::large()),
      language_model("lm_tiny", LanguageModelOptions::tiny()),
      language_model("lm_small", LanguageModelOptions::small()),
  };
  return entries;
}

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const auto& entry : model_entries()) all.push_back(entry.name);
    return all;
  }();
  return names;
}

std::vector<std::string> model_names(ModelFamily family) {
  std::vector<std::string> names;
  for (const auto& entry : model_entries()) {
    if (entry.family == family) names.push_back(entry.name);
  }
  return names;
}

const ModelEntry& model_entry(const std::string& name) {
  const auto& entries = model_entries();
  const auto found =
      std::find_if(entries.begin(), entries.end(), [&](const ModelEntry& e) { return e.name == name; });
  if (found != entries.end()) return *found;
  std::string known;
  for (const auto& entry : entries) known += known.empty() ? entry.name : ", " + entry.name;
  TORCH_CHECK(false, "model must be one of ", known, "; got '", name, "'");
}

void to_json(nlohmann::json& json, const ModelEntry& entry) {
  nlohmann::json preset;
  if (const auto* r = std::get_if<ResNetOptions>(&entry.preset)) {
    preset = {{"depth", r->depth()}};
  } else if (const auto* v = std::get_if<VisionTransformerOptions>(&entry.preset)) {
    preset = {{"embed_dim", v->embed_dim()},
              {"depth", v->depth()},
              {"num_heads", v->num_heads()},
              {"mlp_dim", v->mlp_dim() > 0 ? v->mlp_dim() : 4 * v->embed_dim()}};
  } else {
    const auto& l = std::get<LanguageModelOptions>(entry.preset);
    preset = {{"embed_dim", l.embed_dim()},
              {"depth", l.depth()},
              {"num_heads", l.num_heads()},
              {"mlp_dim", l.mlp_dim() > 0 ? l.mlp_dim() : 4 * l.embed_dim()},
              {"context", l.context()}};
  }
  json = {{"name", entry.name}, {"family", to_string(entry.family)}, {"preset", preset}};
}

void validate(const std::string& name, const ModelConfig& c) {
  const auto& entry = model_entry(name);
  TORCH_CHECK(c.num_classes >= 1, "num_classes must be at least 1, got ", c.num_classes);
  TORCH_CHECK(c.in_channels >= 1, "in_channels must be at least 1, got ", c.in_channels);
  TORCH_CHECK(c.image_size >= 1, "image_size must be at least 1, got ", c.image_size);
  const auto& v = c.convnn;
  TORCH_CHECK(v.k >= 1, "k must be at least 1, got ", v.k);
  TORCH_CHECK(v.num_candidates >= 0, "num_candidates must be 0 (all) or positive, got ", v.num_candidates);
  TORCH_CHECK(v.num_candidates == 0 || v.k <= v.num_candidates, "k = ", v.k,
              " must not exceed num_candidates = ", v.num_candidates, " (k of the r random candidates)");
  if (entry.family != ModelFamily::LanguageModel) {
    check_family_unused(c.lm, visit_lm_fields, name, "language",
                        entry.family == ModelFamily::ResNet ? option_names(ResNetConfig{}, visit_resnet_fields)
                                                            : option_names(ViTConfig{}, visit_vit_fields));
  }
  if (entry.family == ModelFamily::ResNet) {
    check_family_unused(c.vit, visit_vit_fields, name, "ViT",
                        option_names(ResNetConfig{}, visit_resnet_fields));
    const auto& r = c.resnet;
    TORCH_CHECK(r.lambda >= 0.0 && r.lambda <= 1.0, "lambda must be in [0, 1], got ", r.lambda);
    TORCH_CHECK(r.padding >= 0, "padding must be non-negative, got ", r.padding);
    TORCH_CHECK(r.width >= 1, "width must be at least 1, got ", r.width);
    if (r.layer == ResNetLayer::Conv) {
      check_unused(v, visit_convnn_fields,
                   "is not used by " + name + " with layer conv (ConvNN's options apply to layers convnn and branching)");
      TORCH_CHECK(r.padding == ResNetConfig{}.padding, "padding = ", r.padding, " is not used by ", name,
                  " with layer conv (it pads ConvNN's search in layers convnn and branching)");
      TORCH_CHECK(!r.strided_slots, "strided_slots is not used by ", name,
                  " with layer conv (it gives the stride-2 3x3 convolutions to layers convnn and branching)");
    }
    return;
  }
  const bool language = entry.family == ModelFamily::LanguageModel;
  check_family_unused(c.resnet, visit_resnet_fields, name, "ResNet",
                      language ? language_option_names() : option_names(ViTConfig{}, visit_vit_fields));
  const auto& t = c.vit;
  if (language) check_language_model(name, c);
  if (t.attention == ViTAttention::MHSA) {
    check_unused(v, visit_convnn_fields,
                 "is not used by " + name + " with attention mhsa (ConvNN's options apply to attention convnn and kvt)");
  }
  check_dropout(t.dropout, "dropout");
  check_dropout(t.attention_dropout, "attention_dropout");
  check_dropout(t.drop_path, "drop_path");
  if (!language) {
    TORCH_CHECK(t.patch_size >= 1, "patch_size must be at least 1, got ", t.patch_size);
    TORCH_CHECK(c.image_size % t.patch_size == 0, "image_size = ", c.image_size,
                " must be a multiple of patch_size = ", t.patch_size);
  }
  for (const auto& [option, value] : {std::pair{"embed_dim", t.embed_dim}, std::pair{"depth", t.depth},
                                      std::pair{"num_heads", t.num_heads}, std::pair{"mlp_dim", t.mlp_dim}}) {
    TORCH_CHECK(!value || *value >= 1, option, " must be at least 1 (or unset: the preset's), got ", *value);
  }
}

ResNetOptions resnet_options(const std::string& name, const ModelConfig& c) {
  validate(name, c);
  const auto& entry = model_entry(name);
  TORCH_CHECK(entry.family == ModelFamily::ResNet, name, " is not a ResNet (its family is ",
              to_string(entry.family), ")");
  const auto& v = c.convnn;
  const auto& r = c.resnet;
  const auto convnn = nn::ConvNN2dOptions(1, 1, v.k)
                          .padding(r.padding)
                          .num_candidates(v.num_candidates)
                          .similarity(v.similarity.value_or(Similarity::Cosine))
                          .rho(v.rho.value_or(nn::Rho::Uniform))
                          .aggregation(v.aggregation.value_or(nn::Aggregation::Standard));
  return ResNetOptions(std::get<ResNetOptions>(entry.preset))
      .num_classes(c.num_classes)
      .in_channels(c.in_channels)
      .width(r.width)
      .small_stem(r.small_stem)
      .slots(ResNetLayerOptions().layer(r.layer).convnn(convnn).lambda(r.lambda).strided_slots(r.strided_slots));
}

VisionTransformerOptions vit_options(const std::string& name, const ModelConfig& c) {
  validate(name, c);
  const auto& v = c.convnn;
  const auto& t = c.vit;
  const auto& entry = model_entry(name);
  TORCH_CHECK(entry.family == ModelFamily::ViT, name, " is not a ViT (its family is ", to_string(entry.family),
              ")");
  auto o = std::get<VisionTransformerOptions>(entry.preset);
  apply_transformer_sizes(o, t, name);
  const auto attention = transformer_attention(v, o.embed_dim(), o.num_heads());
  o.image_size(c.image_size)
      .patch_size(t.patch_size)
      .in_channels(c.in_channels)
      .num_classes(c.num_classes)
      .attention(t.attention)
      .convnn(attention)
      .dropout(t.dropout)
      .attention_dropout(t.attention_dropout)
      .drop_path(t.drop_path);
  if (t.paper) o.paper_variant();
  if (t.position_embedding) o.position_embedding(*t.position_embedding);
  return o;
}

LanguageModelOptions language_model_options(const std::string& name, const ModelConfig& c) {
  validate(name, c);
  const auto& entry = model_entry(name);
  TORCH_CHECK(entry.family == ModelFamily::LanguageModel, name, " is not a language model (its family is ",
              to_string(entry.family), ")");
  const auto& v = c.convnn;
  const auto& t = c.vit;
  auto o = std::get<LanguageModelOptions>(entry.preset);
  apply_transformer_sizes(o, t, name);
  if (c.lm.context) o.context(*c.lm.context);
  TORCH_CHECK(c.lm.num_kv_heads == 0 || o.num_heads() % c.lm.num_kv_heads == 0, "num_kv_heads = ",
              c.lm.num_kv_heads, " must divide num_heads = ", o.num_heads(), t.num_heads ? "" : " (" + name + "'s)");
  const auto attention = transformer_attention(v, o.embed_dim(), o.num_heads());
  o.vocab_size(c.num_classes)
      .num_kv_heads(c.lm.num_kv_heads)
      .attention(t.attention)
      .convnn(attention)
      .dropout(t.dropout)
      .attention_dropout(t.attention_dropout)
      .drop_path(t.drop_path);
  if (t.position_embedding) o.position_embedding(*t.position_embedding);
  return o;
}

Model::Model(std::string name, ModelConfig config, torch::nn::AnyModule module,
             std::function<CostReport(int64_t, int64_t)> cost)
    : name_(std::move(name)),
      config_(std::move(config)),
      module_(std::move(module)),
      cost_(std::move(cost)) {}

int64_t Model::parameter_count() const {
  int64_t total = 0;
  for (const auto& p : module()->parameters()) total += p.numel();
  return total;
}

Model build_model(const std::string& name, const ModelConfig& config) {
  const auto& entry = model_entry(name);
  return entry.build(entry, config);
}

}  // namespace convnn::models
