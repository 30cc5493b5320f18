#include "model_options.h"

#include <fmt/format.h>

#include <charconv>
#include <optional>
#include <system_error>

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

namespace {

// The text as an int64, or nullopt where it is not one whole integer (out of range included).
std::optional<int64_t> whole_integer(const std::string& text) {
  int64_t value = 0;
  const char* begin = text.data() + (text.front() == '+' ? 1 : 0);  // from_chars takes no '+'
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(begin, end, value);
  if (error != std::errc() || stop != end) return std::nullopt;
  return value;
}

bool looks_integral(const std::string& text) {
  const auto digits = text.find_first_not_of("+-");
  return !text.empty() && digits != std::string::npos && digits <= 1 &&
         text.find_first_not_of("0123456789", digits) == std::string::npos;
}

}  // namespace

CLI::Validator integer_at_least(int64_t minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        if (!looks_integral(text)) return "";  // CLI11's conversion names a non-number
        const auto value = whole_integer(text);
        if (value && *value >= minimum) return "";
        return fmt::format("must be an integer of at least {}, got {}", minimum, text);
      },
      minimum == 0 ? "NONNEGATIVE" : minimum == 1 ? "POSITIVE" : fmt::format("AT_LEAST_{}", minimum));
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (!looks_integral(text)) return "";
        const auto value = whole_integer(text);
        if (value && *value >= 0) return "";
        return "must be an integer in [0, 2^63), got " + text;
      },
      "SEED");
}

void add_model_options(CLI::App* sub, std::string& name, models::ModelConfig& c) {
  // The values shown after "=" in --help are the struct's (CLI11 captures them: main.cpp sets
  // always_capture_default); an unset optional's help says what it becomes.
  sub->add_option("--model", name, "Model name")->required()->check(CLI::IsMember(models::model_names()));
  sub->add_option("--num-classes", c.num_classes,
                  "Classes of the head, or a language model's vocabulary (unset: the model's own: 1000 for the "
                  "image models, 256 byte tokens for a language model)");
  sub->add_option("--in-channels", c.in_channels, "Input channels");
  sub->add_option("--image-size", c.image_size, "Side of the square input images in pixels");
  sub->add_option("--k", c.convnn.k, "ConvNN neighbours K");
  sub->add_option("--num-candidates", c.convnn.num_candidates, "Random candidates r; 0 = all");
  add_enum_option(
      sub, "--similarity", c.convnn.similarity, [](const std::string& s) { return parse_similarity(s); },
      similarity_names(), "ConvNN similarity (unset: cosine for ResNet, scaled_dot for ViT)");
  add_enum_option(sub, "--rho", c.convnn.rho, nn::parse_rho, rho_names(),
                  "ConvNN weights rho (unset: uniform for ResNet, softmax for ViT)");
  add_enum_option(sub, "--aggregation", c.convnn.aggregation, nn::parse_aggregation, nn::aggregation_names(),
                  "ConvNN aggregation (unset: standard for ResNet, depthwise for ViT)");
  add_enum_option(sub, "--layer", c.resnet.layer, models::parse_resnet_layer, models::resnet_layer_names(),
                  "ResNet: layer of the stride-1 3x3 slots (and the stride-2 ones with --strided-slots)");
  sub->add_option("--lambda", c.resnet.lambda, "ResNet branching: share of ConvNN channels");
  sub->add_option("--padding", c.resnet.padding, "ResNet ConvNN: zero padding before the search");
  sub->add_flag("--small-stem", c.resnet.small_stem,
                "ResNet: 3x3 stride-1 stem without max-pool, for 28-32 px");
  sub->add_option("--width", c.resnet.width, "ResNet: channels of the first stage");
  sub->add_flag("--strided-slots", c.resnet.strided_slots,
                "ResNet: the stride-2 3x3 convolutions take the layer too, with stride 2 (the paper "
                "replaces only the stride-1 ones)");
  sub->add_option("--patch-size", c.vit.patch_size, "ViT: patch side in pixels");
  add_enum_option(sub, "--attention", c.vit.attention, models::parse_vit_attention, models::vit_attention_names(),
                  "ViT and language models: attention");
  sub->add_flag("--paper", c.vit.paper,
                "ViT: the paper authors' variant (sinusoidal positions, patch LayerNorm, no final "
                "LayerNorm, bias-free attention projections)");
  add_enum_option(sub, "--position-embedding", c.vit.position_embedding, models::parse_position_embedding,
                  models::position_embedding_names(), "ViT and language models: position embedding (unset: learned; sinusoidal with --paper)");
  // Left out: the preset's (models::validate checks a given value).
  sub->add_option("--embed-dim", c.vit.embed_dim, "ViT and language models: width (unset: the preset's)");
  sub->add_option("--depth", c.vit.depth, "ViT and language models: blocks (unset: the preset's)");
  sub->add_option("--num-heads", c.vit.num_heads, "ViT and language models: heads (unset: the preset's)");
  sub->add_option("--mlp-dim", c.vit.mlp_dim, "ViT and language models: MLP width (unset: 4 x width)");
  sub->add_option("--dropout", c.vit.dropout, "ViT and language models: dropout");
  sub->add_option("--attention-dropout", c.vit.attention_dropout, "ViT and language models: attention dropout");
  sub->add_option("--drop-path", c.vit.drop_path, "ViT and language models: stochastic depth of the last block");
  sub->add_option("--context", c.lm.context, "Language models: the longest sequence in tokens (unset: the preset's)");
  sub->add_option("--num-kv-heads", c.lm.num_kv_heads,
                  "Language models: key/value heads shared by groups of query heads; 0 = num_heads");
}

}  // namespace convnn::cli
