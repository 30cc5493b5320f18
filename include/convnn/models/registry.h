#pragma once
// Models built by name from one registry, so that training and `convnn info` build the same
// thing from the same options.
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "convnn/models/cost.h"
#include "convnn/models/language_model.h"
#include "convnn/models/resnet.h"
#include "convnn/models/vit.h"

namespace convnn::models {

/// ConvNN's choices: the layers of the ResNet slots, the ViT's kvt / convnn attention. Unset
/// options take the paper's choice for the family.
struct ConvNNConfig {
  int64_t k = 9;
  /// 0: all candidates; r: r random candidates per forward (the paper's ResNet uses 32).
  int64_t num_candidates = 0;
  std::optional<Similarity> similarity;        // ResNet: cosine; ViT: scaled_dot
  std::optional<nn::Rho> rho;                  // ResNet: uniform; ViT: softmax
  std::optional<nn::Aggregation> aggregation;  // ResNet: standard; ViT: depthwise
};

/// The options of the ResNet family only.
struct ResNetConfig {
  ResNetLayer layer = ResNetLayer::Conv;
  double lambda = 0.5;
  int64_t padding = 1;
  bool small_stem = false;
  int64_t width = 64;
  /// The stride-2 3x3 convolutions take the layer too (ResNetLayerOptions::strided_slots).
  bool strided_slots = false;
};

/// The options of the ViT family only. Unset sizes are the preset's (tiny, small, base).
struct ViTConfig {
  int64_t patch_size = 16;
  ViTAttention attention = ViTAttention::MHSA;
  /// The paper authors' variant (VisionTransformerOptions::paper_variant).
  bool paper = false;
  std::optional<PositionEmbedding> position_embedding;  // learned; sinusoidal with paper
  std::optional<int64_t> embed_dim, depth, num_heads;
  std::optional<int64_t> mlp_dim;  // unset: 4 x embed_dim
  double dropout = 0.0;
  double attention_dropout = 0.0;
  double drop_path = 0.0;
};

/// The options of the language models only. Their sizes, attention, position embedding and
/// dropouts are ViTConfig's options (the same names on the command line and in JSON).
struct LanguageModelConfig {
  std::optional<int64_t> context;  // tokens; unset: the preset's
  int64_t num_kv_heads = 0;        // grouped-query attention; 0: num_heads
};

/// A model's options: those of every model, ConvNN's, and one family's. The other families'
/// options must keep their defaults (validate names the first that does not). A language model
/// takes the ViT options but patch_size and paper, and its vocabulary is num_classes.
struct ModelConfig {
  /// Classes, or a language model's vocabulary; unset: the model's own (ResNetOptions and
  /// VisionTransformerOptions: ImageNet's 1000 classes; LanguageModelOptions: 256, byte tokens).
  std::optional<int64_t> num_classes;
  int64_t in_channels = 3;
  /// Side of the square input images in pixels.
  int64_t image_size = 224;
  ConvNNConfig convnn;
  ResNetConfig resnet;
  ViTConfig vit;
  LanguageModelConfig lm;
};

/// JSON: one flat object, a key per option as `convnn info` and Python's create_model name them
/// (enums by name, unset options as null). Reading accepts any subset of the keys and rejects
/// unknown keys and ill-typed or unknown values; the 0 that older files hold for a preset's size
/// (embed_dim, depth, num_heads, mlp_dim) reads as unset.
void to_json(nlohmann::json& json, const ModelConfig& config);
void from_json(const nlohmann::json& json, ModelConfig& config);

/// Which options a model takes (ModelConfig's resnet or vit part) and how it is built.
enum class ModelFamily { ResNet, ViT, LanguageModel };
const char* to_string(ModelFamily family);
ModelFamily parse_model_family(std::string_view name);
/// "resnet", "vit", "lm": the families in value order.
const std::vector<std::string>& model_family_names();

class Model;
struct ModelEntry;

/// A family, one row of model_families(): everything the library, the command line and the
/// Python package know of it. Validation, the builders, timm's names (python/convnn/timm_models.py
/// reads model_family_table()) and `convnn compare`'s grid follow the rows, so a new family is a
/// row (with its preset's options type and, if it has options of its own, a ModelConfig part).
struct ModelFamilyRow {
  ModelFamily family;
  /// "resnet", as options and JSON name it; "ResNet", as messages do ("applies to ResNet models").
  const char* name;
  const char* title;
  /// The parts of ModelConfig it reads; the others must keep their defaults.
  bool reads_resnet, reads_vit, reads_lm;
  /// Its own options, as messages list them ("layer, lambda, padding, ...").
  std::string (*own_options)();
  /// Its rules beyond those of every model and the unread parts (c10::Error naming the option).
  void (*check)(const std::string& name, const ModelConfig& config);
  /// Builds the model `entry` names with a config (validated first).
  Model (*build)(const ModelEntry& entry, const ModelConfig& config);
  /// The option that picks its layer ("layer"), that option's value without ConvNN ("conv"), which
  /// refuses ConvNN's options, and its ConvNN values in the order `convnn compare` trains them.
  const char* layer_option;
  const char* baseline_layer;
  std::vector<std::string> convnn_layers;
  /// Options of its own that only its ConvNN layers read, each with what it does there.
  std::vector<std::pair<std::string, std::string>> convnn_only_options;
  /// An image classifier: timm lists it and `convnn compare` has cells for it (the language
  /// models read tokens).
  bool image_classifier;
  /// `convnn compare` also trains its ConvNN cells on random candidates.
  bool compare_random_candidates;
  /// How timm lists it, as a JSON object (nullptr: not in timm): "variants" (name suffix -> that
  /// variant's option defaults; "" for the name itself), "out_indices" (features_only's default
  /// taps), timm's "first_conv" and "classifier", "feature_map" (forward_features is a feature map,
  /// which has a pool_size) and "dynamic_img_size" (whether it takes timm's option of that name).
  const char* timm;
};

/// The families, in value order.
const std::vector<ModelFamilyRow>& model_families();
const ModelFamilyRow& model_family(ModelFamily family);
/// A row as Python's model_family_table() gives it (the function pointers left out).
void to_json(nlohmann::json& json, const ModelFamilyRow& row);

/// One row of the registry, as timm's model entrypoints: a name, its family (whose row builds it)
/// and the architecture the name stands for (its default config, on which a ModelConfig's options
/// apply).
struct ModelEntry {
  std::string name;
  ModelFamily family;
  /// ResNetOptions (the depth) for a ResNet, VisionTransformerOptions (embed_dim, depth, num_heads,
  /// mlp_dim) for a ViT, LanguageModelOptions (those and the context) for a language model.
  std::variant<ResNetOptions, VisionTransformerOptions, LanguageModelOptions> preset;
};

/// The registry: one row per model, in the order `convnn info --list` shows them. Every list of
/// model names (the command line, the Python package, timm's registration) is read from it.
const std::vector<ModelEntry>& model_entries();
/// The row of `name`; c10::Error naming the valid names for an unknown one.
const ModelEntry& model_entry(const std::string& name);
/// The names of model_entries(), in order.
const std::vector<std::string>& model_names();
/// The names of one family's rows, in order.
std::vector<std::string> model_names(ModelFamily family);
/// {"name", "family", "preset": the preset's sizes}: a row for `convnn info --list --json` and Python.
void to_json(nlohmann::json& json, const ModelEntry& entry);

/// Checks every option's value (c10::Error naming the option, its value and the rule).
void validate(const std::string& name, const ModelConfig& config);
/// The options build_model uses for a ResNet / ViT name (c10::Error for a name of the other family).
ResNetOptions resnet_options(const std::string& name, const ModelConfig& config);
VisionTransformerOptions vit_options(const std::string& name, const ModelConfig& config);
LanguageModelOptions language_model_options(const std::string& name, const ModelConfig& config);

/// A model of the registry: its module behind forward(images), with its name, config and cost.
class Model {
 public:
  Model(std::string name, ModelConfig config, torch::nn::AnyModule module,
        std::function<CostReport(int64_t, int64_t)> cost);

  /// images [B, in_channels, image_size, image_size] -> logits [B, num_classes]; a language
  /// model: tokens int64 [B, T] -> logits [B, T, num_classes].
  at::Tensor forward(const at::Tensor& images) { return module_.forward(images); }
  at::Tensor operator()(const at::Tensor& images) { return forward(images); }
  /// The module itself: parameters(), train() / eval(), to(), torch::save / torch::load, printing.
  std::shared_ptr<torch::nn::Module> module() const { return module_.ptr(); }
  /// The typed module, e.g. model.get<ResNetImpl>(); throws when the type differs.
  template <typename ModuleType>
  std::shared_ptr<ModuleType> get() const {
    return module_.ptr<ModuleType>();
  }
  /// Every operation for one image_size x image_size image (a language model: one sequence of its
  /// context).
  CostReport cost() const { return cost_(config_.image_size, config_.image_size); }
  int64_t parameter_count() const;
  const std::string& name() const { return name_; }
  const ModelConfig& config() const { return config_; }

 private:
  std::string name_;
  ModelConfig config_;
  torch::nn::AnyModule module_;
  std::function<CostReport(int64_t, int64_t)> cost_;
};

/// The model `name` (see model_entries) with `config`; c10::Error for an unknown name or a bad
/// option, including a K larger than the tokens some layer sees at this image size.
Model build_model(const std::string& name, const ModelConfig& config = {});

}  // namespace convnn::models
