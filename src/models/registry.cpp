#include "convnn/models/registry.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>
#include <type_traits>
#include <utility>

#include "util/json_fields.h"

namespace convnn::models {
namespace {

bool is_resnet(const std::string& name) { return name.rfind("resnet", 0) == 0; }

// Calls visit(key, field) for every field, in the order of the struct: the one list that both
// JSON directions follow.
template <typename Config, typename Visitor>
void visit_fields(Config& c, Visitor&& visit) {
  visit("num_classes", c.num_classes);
  visit("in_channels", c.in_channels);
  visit("image_size", c.image_size);
  visit("k", c.k);
  visit("num_candidates", c.num_candidates);
  visit("similarity", c.similarity);
  visit("rho", c.rho);
  visit("aggregation", c.aggregation);
  visit("layer", c.layer);
  visit("lambda", c.lambda);
  visit("padding", c.padding);
  visit("small_stem", c.small_stem);
  visit("width", c.width);
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
}

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

const auto visit_model_fields = [](auto& config, auto&& visit) { visit_fields(config, visit); };

void check_dropout(double p, const char* option) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, option, " must be in [0, 1), got ", p);
}

}  // namespace

void to_json(nlohmann::json& json, const ModelConfig& config) {
  json = detail::config_to_json(config, visit_model_fields, ModelEnums{});
}

void from_json(const nlohmann::json& json, ModelConfig& config) {
  detail::config_from_json(json, config, "model config", visit_model_fields, ModelEnums{});
}

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names{"resnet18", "resnet34",  "resnet50",
                                              "vit_tiny", "vit_small", "vit_base"};
  return names;
}

void validate(const std::string& name, const ModelConfig& c) {
  const auto& names = model_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string known;
    for (const auto& n : names) known += known.empty() ? n : ", " + n;
    TORCH_CHECK(false, "model must be one of ", known, "; got '", name, "'");
  }
  TORCH_CHECK(c.num_classes >= 1, "num_classes must be at least 1, got ", c.num_classes);
  TORCH_CHECK(c.in_channels >= 1, "in_channels must be at least 1, got ", c.in_channels);
  TORCH_CHECK(c.image_size >= 1, "image_size must be at least 1, got ", c.image_size);
  TORCH_CHECK(c.k >= 1, "k must be at least 1, got ", c.k);
  TORCH_CHECK(c.num_candidates >= 0, "num_candidates must be 0 (all) or positive, got ", c.num_candidates);
  TORCH_CHECK(c.num_candidates == 0 || c.k <= c.num_candidates, "k = ", c.k,
              " must not exceed num_candidates = ", c.num_candidates, " (k of the r random candidates)");
  check_dropout(c.dropout, "dropout");
  check_dropout(c.attention_dropout, "attention_dropout");
  check_dropout(c.drop_path, "drop_path");
  if (is_resnet(name)) {
    TORCH_CHECK(c.attention == ViTAttention::MHSA, "attention = ", to_string(c.attention),
                " applies to ViT models; ", name, " takes layer = conv, convnn or branching");
    TORCH_CHECK(!c.paper && !c.position_embedding, "paper and position_embedding apply to ViT models, not ",
                name);
    TORCH_CHECK(c.lambda >= 0.0 && c.lambda <= 1.0, "lambda must be in [0, 1], got ", c.lambda);
    TORCH_CHECK(c.padding >= 0, "padding must be non-negative, got ", c.padding);
    TORCH_CHECK(c.width >= 1, "width must be at least 1, got ", c.width);
  } else {
    TORCH_CHECK(c.layer == ResNetLayer::Conv, "layer = ", to_string(c.layer), " applies to ResNet models; ",
                name, " takes attention = mhsa, kvt or convnn");
    TORCH_CHECK(!c.small_stem, "small_stem applies to ResNet models; ", name, " takes patch_size");
    TORCH_CHECK(c.patch_size >= 1, "patch_size must be at least 1, got ", c.patch_size);
    TORCH_CHECK(c.image_size % c.patch_size == 0, "image_size = ", c.image_size,
                " must be a multiple of patch_size = ", c.patch_size);
    for (const auto& [option, value] : {std::pair{"embed_dim", c.embed_dim}, std::pair{"depth", c.depth},
                                        std::pair{"num_heads", c.num_heads}, std::pair{"mlp_dim", c.mlp_dim}}) {
      TORCH_CHECK(value >= 0, option, " must be 0 (the preset's) or positive, got ", value);
    }
  }
}

ResNetOptions resnet_options(const std::string& name, const ModelConfig& c) {
  validate(name, c);
  const int64_t depth = std::stoll(name.substr(std::string_view("resnet").size()));
  const auto convnn = nn::ConvNN2dOptions(1, 1, c.k)
                          .padding(c.padding)
                          .num_candidates(c.num_candidates)
                          .similarity(c.similarity.value_or(Similarity::Cosine))
                          .rho(c.rho.value_or(nn::Rho::Uniform))
                          .aggregation(c.aggregation.value_or(nn::Aggregation::Standard));
  return ResNetOptions(depth)
      .num_classes(c.num_classes)
      .in_channels(c.in_channels)
      .width(c.width)
      .small_stem(c.small_stem)
      .slots(ResNetLayerOptions().layer(c.layer).convnn(convnn).lambda(c.lambda));
}

VisionTransformerOptions vit_options(const std::string& name, const ModelConfig& c) {
  validate(name, c);
  auto o = name == "vit_tiny"    ? VisionTransformerOptions::tiny()
           : name == "vit_small" ? VisionTransformerOptions::small()
                                 : VisionTransformerOptions::base();
  if (c.embed_dim > 0) o.embed_dim(c.embed_dim);
  if (c.depth > 0) o.depth(c.depth);
  if (c.num_heads > 0) o.num_heads(c.num_heads);
  // One of the two may be the preset's, which the user never typed: the message says which.
  const auto preset_note = [&name](int64_t given) { return given > 0 ? "" : " (" + name + "'s)"; };
  TORCH_CHECK(o.embed_dim() % o.num_heads() == 0, "num_heads = ", o.num_heads(), preset_note(c.num_heads),
              " must divide embed_dim = ", o.embed_dim(), preset_note(c.embed_dim));
  const auto attention = nn::ConvNNAttentionOptions(o.embed_dim(), o.num_heads(), c.k)
                             .num_candidates(c.num_candidates)
                             .similarity(c.similarity.value_or(Similarity::ScaledDot))
                             .rho(c.rho.value_or(nn::Rho::Softmax))
                             .aggregation(c.aggregation.value_or(nn::Aggregation::Depthwise));
  o.image_size(c.image_size)
      .patch_size(c.patch_size)
      .in_channels(c.in_channels)
      .num_classes(c.num_classes)
      .mlp_dim(c.mlp_dim)
      .attention(c.attention)
      .convnn(attention)
      .dropout(c.dropout)
      .attention_dropout(c.attention_dropout)
      .drop_path(c.drop_path);
  if (c.paper) o.paper_variant();
  if (c.position_embedding) o.position_embedding(*c.position_embedding);
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
  if (is_resnet(name)) {
    ResNet net(resnet_options(name, config));
    Model model(name, config, torch::nn::AnyModule(net),
                [net](int64_t h, int64_t w) { return net->cost(h, w); });
    net->check_image_size(config.image_size, config.image_size);
    return model;
  }
  VisionTransformer net(vit_options(name, config));
  return Model(name, config, torch::nn::AnyModule(net),
               [net](int64_t h, int64_t w) { return net->cost(h, w); });
}

}  // namespace convnn::models
