#include "model_options.h"

namespace convnn::cli {

CLI::Validator explicit_value(const std::string& left_out, bool allow_zero) {
  return CLI::Validator(
      [left_out, allow_zero](std::string& text) -> std::string {
        double value = 0.0;
        if (!CLI::detail::lexical_cast(text, value)) return "";
        if (allow_zero ? value >= 0.0 : value > 0.0) return "";
        return std::string("must be ") + (allow_zero ? "non-negative" : "positive") + ", got " + text +
               " (leave the flag out for " + left_out + ")";
      },
      allow_zero ? "NONNEGATIVE" : "POSITIVE");
}

void add_model_options(CLI::App* sub, std::string& name, models::ModelConfig& c) {
  sub->add_option("--model", name, "Model name")->required()->check(CLI::IsMember(models::model_names()));
  sub->add_option("--num-classes", c.num_classes, "Classes of the head (default 1000)");
  sub->add_option("--in-channels", c.in_channels, "Input channels (default 3)");
  sub->add_option("--image-size", c.image_size, "Side of the square input images in pixels (default 224)");
  sub->add_option("--k", c.k, "ConvNN neighbours K (default 9)");
  sub->add_option("--num-candidates", c.num_candidates, "Random candidates r; 0 = all (default 0)");
  add_enum_option(
      sub, "--similarity", c.similarity, [](const std::string& s) { return parse_similarity(s); },
      similarity_names(),
      "ConvNN similarity (default: cosine for ResNet, scaled_dot for ViT)");
  add_enum_option(sub, "--rho", c.rho, nn::parse_rho, rho_names(),
                  "ConvNN weights rho (default: uniform for ResNet, softmax for ViT)");
  add_enum_option(sub, "--aggregation", c.aggregation, nn::parse_aggregation, {"standard", "depthwise"},
                  "ConvNN aggregation (default: standard for ResNet, depthwise for ViT)");
  add_enum_option(sub, "--layer", c.layer, models::parse_resnet_layer, {"conv", "convnn", "branching"},
                  "ResNet: layer of the stride-1 3x3 slots (default conv)");
  sub->add_option("--lambda", c.lambda, "ResNet branching: share of ConvNN channels (default 0.5)");
  sub->add_option("--padding", c.padding, "ResNet ConvNN: zero padding before the search (default 1)");
  sub->add_flag("--small-stem", c.small_stem, "ResNet: 3x3 stride-1 stem without max-pool, for 28-32 px");
  sub->add_option("--width", c.width, "ResNet: channels of the first stage (default 64)");
  sub->add_option("--patch-size", c.patch_size, "ViT: patch side in pixels (default 16)");
  add_enum_option(sub, "--attention", c.attention, models::parse_vit_attention, {"mhsa", "kvt", "convnn"},
                  "ViT: attention (default mhsa)");
  sub->add_flag("--paper", c.paper,
                "ViT: the paper authors' variant (sinusoidal positions, patch LayerNorm, no final "
                "LayerNorm, bias-free attention projections)");
  add_enum_option(sub, "--position-embedding", c.position_embedding, models::parse_position_embedding,
                  {"learned", "sinusoidal"},
                  "ViT: position embedding (default learned; sinusoidal with --paper)");
  // 0 in these fields means the preset's value (ModelConfig), which leaving the flag out gives.
  const auto preset = explicit_value("the preset's value");
  sub->add_option("--embed-dim", c.embed_dim, "ViT: width (default: the preset's)")->check(preset);
  sub->add_option("--depth", c.depth, "ViT: blocks (default: the preset's)")->check(preset);
  sub->add_option("--num-heads", c.num_heads, "ViT: heads (default: the preset's)")->check(preset);
  sub->add_option("--mlp-dim", c.mlp_dim, "ViT: MLP width (default 4 x width)")
      ->check(explicit_value("4 x width"));
  sub->add_option("--dropout", c.dropout, "ViT: dropout (default 0)");
  sub->add_option("--attention-dropout", c.attention_dropout, "ViT: attention dropout (default 0)");
  sub->add_option("--drop-path", c.drop_path, "ViT: stochastic depth of the last block (default 0)");
}

}  // namespace convnn::cli
