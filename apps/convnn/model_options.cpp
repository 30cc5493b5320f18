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
  sub->add_option("--k", c.convnn.k, "ConvNN neighbours K (default 9)");
  sub->add_option("--num-candidates", c.convnn.num_candidates, "Random candidates r; 0 = all (default 0)");
  add_enum_option(
      sub, "--similarity", c.convnn.similarity, [](const std::string& s) { return parse_similarity(s); },
      similarity_names(), "ConvNN similarity (default: cosine for ResNet, scaled_dot for ViT)");
  add_enum_option(sub, "--rho", c.convnn.rho, nn::parse_rho, rho_names(),
                  "ConvNN weights rho (default: uniform for ResNet, softmax for ViT)");
  add_enum_option(sub, "--aggregation", c.convnn.aggregation, nn::parse_aggregation,
                  {"standard", "depthwise"},
                  "ConvNN aggregation (default: standard for ResNet, depthwise for ViT)");
  add_enum_option(sub, "--layer", c.resnet.layer, models::parse_resnet_layer, {"conv", "convnn", "branching"},
                  "ResNet: layer of the stride-1 3x3 slots (default conv)");
  sub->add_option("--lambda", c.resnet.lambda, "ResNet branching: share of ConvNN channels (default 0.5)");
  sub->add_option("--padding", c.resnet.padding, "ResNet ConvNN: zero padding before the search (default 1)");
  sub->add_flag("--small-stem", c.resnet.small_stem,
                "ResNet: 3x3 stride-1 stem without max-pool, for 28-32 px");
  sub->add_option("--width", c.resnet.width, "ResNet: channels of the first stage (default 64)");
  sub->add_option("--patch-size", c.vit.patch_size, "ViT: patch side in pixels (default 16)");
  add_enum_option(sub, "--attention", c.vit.attention, models::parse_vit_attention, {"mhsa", "kvt", "convnn"},
                  "ViT: attention (default mhsa)");
  sub->add_flag("--paper", c.vit.paper,
                "ViT: the paper authors' variant (sinusoidal positions, patch LayerNorm, no final "
                "LayerNorm, bias-free attention projections)");
  add_enum_option(sub, "--position-embedding", c.vit.position_embedding, models::parse_position_embedding,
                  {"learned", "sinusoidal"},
                  "ViT: position embedding (default learned; sinusoidal with --paper)");
  // Left out: the preset's (models::validate checks a given value).
  sub->add_option("--embed-dim", c.vit.embed_dim, "ViT: width (default: the preset's)");
  sub->add_option("--depth", c.vit.depth, "ViT: blocks (default: the preset's)");
  sub->add_option("--num-heads", c.vit.num_heads, "ViT: heads (default: the preset's)");
  sub->add_option("--mlp-dim", c.vit.mlp_dim, "ViT: MLP width (default 4 x width)");
  sub->add_option("--dropout", c.vit.dropout, "ViT: dropout (default 0)");
  sub->add_option("--attention-dropout", c.vit.attention_dropout, "ViT: attention dropout (default 0)");
  sub->add_option("--drop-path", c.vit.drop_path, "ViT: stochastic depth of the last block (default 0)");
}

}  // namespace convnn::cli
