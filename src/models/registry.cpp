#include "convnn/models/registry.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>
#include <type_traits>
#include <utility>

#include "models/model_config_fields.h"
#include "models/model_families.h"
#include "util/json_fields.h"

namespace convnn::models {
namespace {

using namespace model_fields;

// std::visit over a set of lambdas.
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;


// Files written before the options were optional hold 0 for "the preset's".
nlohmann::json without_legacy_zeros(nlohmann::json json) {
  if (!json.is_object()) return json;
  for (const char* key : {"embed_dim", "depth", "num_heads", "mlp_dim"}) {
    if (json.contains(key) && json[key].is_number_integer() && json[key].get<int64_t>() == 0)
      json[key] = nullptr;
  }
  return json;
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

ModelEntry language_model(std::string name, LanguageModelOptions preset) {
  return {std::move(name), ModelFamily::LanguageModel, std::move(preset)};
}

ModelEntry resnet(std::string name, int64_t depth) {
  return {std::move(name), ModelFamily::ResNet, ResNetOptions(depth)};
}

ModelEntry vit(std::string name, VisionTransformerOptions preset) {
  return {std::move(name), ModelFamily::ViT, std::move(preset)};
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
  const auto transformer_sizes = [](const auto& o) {
    return nlohmann::json{{"embed_dim", o.embed_dim()},
                          {"depth", o.depth()},
                          {"num_heads", o.num_heads()},
                          {"mlp_dim", o.mlp_dim() > 0 ? o.mlp_dim() : 4 * o.embed_dim()}};
  };
  const auto preset = std::visit(
      Overloaded{[](const ResNetOptions& r) { return nlohmann::json{{"depth", r.depth()}}; },
                 [&](const VisionTransformerOptions& v) { return transformer_sizes(v); },
                 [&](const LanguageModelOptions& l) {
                   auto sizes = transformer_sizes(l);
                   sizes["context"] = l.context();
                   return sizes;
                 }},
      entry.preset);
  json = {{"name", entry.name}, {"family", to_string(entry.family)}, {"preset", preset}};
}

void validate(const std::string& name, const ModelConfig& c) {
  model_entry(name);  // an unknown name first
  TORCH_CHECK(c.num_classes.value_or(1) >= 1, "num_classes must be at least 1, got ", c.num_classes.value_or(1));
  TORCH_CHECK(c.in_channels >= 1, "in_channels must be at least 1, got ", c.in_channels);
  TORCH_CHECK(c.image_size >= 1, "image_size must be at least 1, got ", c.image_size);
  const auto& v = c.convnn;
  TORCH_CHECK(v.k >= 1, "k must be at least 1, got ", v.k);
  TORCH_CHECK(v.num_candidates >= 0, "num_candidates must be 0 (all) or positive, got ", v.num_candidates);
  TORCH_CHECK(v.num_candidates == 0 || v.k <= v.num_candidates, "k = ", v.k,
              " must not exceed num_candidates = ", v.num_candidates, " (k of the r random candidates)");
  check_family_options(name, c);
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
  auto o = ResNetOptions(std::get<ResNetOptions>(entry.preset));
  if (c.num_classes) o.num_classes(*c.num_classes);
  return o.in_channels(c.in_channels)
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
      .attention(t.attention)
      .convnn(attention)
      .dropout(t.dropout)
      .attention_dropout(t.attention_dropout)
      .drop_path(t.drop_path);
  if (c.num_classes) o.num_classes(*c.num_classes);
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
  if (c.num_classes) o.vocab_size(*c.num_classes);
  o.num_kv_heads(c.lm.num_kv_heads)
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
  return model_family(entry.family).build(entry, config);
}

}  // namespace convnn::models
