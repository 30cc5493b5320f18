#pragma once
// The fields of ModelConfig's parts, listed once (both JSON directions, validation and the family
// rows follow these lists), the names its enums travel by, and the checks that compare a part with
// its defaults. Shared by the registry (registry.cpp) and the family rows (model_families.cpp).
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "convnn/models/registry.h"
#include "util/json_fields.h"

namespace convnn::models::model_fields {


// Each part's fields, in the order of its struct: the one list that both JSON directions and the
// family check follow.
inline const auto visit_convnn_fields = [](auto& c, auto&& visit) {
  visit("k", c.k);
  visit("num_candidates", c.num_candidates);
  visit("similarity", c.similarity);
  visit("rho", c.rho);
  visit("aggregation", c.aggregation);
};
inline const auto visit_resnet_fields = [](auto& c, auto&& visit) {
  visit("layer", c.layer);
  visit("lambda", c.lambda);
  visit("padding", c.padding);
  visit("small_stem", c.small_stem);
  visit("width", c.width);
  visit("strided_slots", c.strided_slots);
};
inline const auto visit_vit_fields = [](auto& c, auto&& visit) {
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
inline const auto visit_lm_fields = [](auto& c, auto&& visit) {
  visit("context", c.context);
  visit("num_kv_heads", c.num_kv_heads);
};
// The model's JSON is flat (the keys of `convnn info` and Python's create_model).
inline const auto visit_model_fields = [](auto& c, auto&& visit) {
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

inline void check_dropout(double p, const char* option) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, option, " must be in [0, 1), got ", p);
}

// Options the model does not use keep their defaults: one given is an error rather than silently
// ignored. Compared as JSON, so that the message names the option; `why` ends it.
template <typename Part, typename VisitFields>
void check_unused(const Part& given, VisitFields visit_fields, const std::string& why) {
  const auto json_given = convnn::detail::config_to_json(given, visit_fields, ModelEnums{});
  const auto json_default = convnn::detail::config_to_json(Part{}, visit_fields, ModelEnums{});
  for (const auto& item : json_default.items()) {
    const auto& value = json_given.at(item.key());
    const auto shown = value.is_string() ? value.template get<std::string>() : convnn::detail::shown(value);
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

}  // namespace convnn::models::model_fields
