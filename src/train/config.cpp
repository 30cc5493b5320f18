#include "convnn/train/config.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "convnn/data/datasets.h"
#include "convnn/data/image_folder_source.h"
#include "util/enum_names.h"
#include "util/json_fields.h"

namespace convnn::train {
namespace {

constexpr detail::NameTable<OptimizerKind, 2> kOptimizers{{{"adamw", OptimizerKind::AdamW},
                                                            {"sgd", OptimizerKind::Sgd}}};
constexpr detail::NameTable<DecayOn, 2> kDecayOn{{{"all", DecayOn::All}, {"weights", DecayOn::Weights}}};
constexpr detail::NameTable<Schedule, 2> kSchedules{{{"cosine", Schedule::Cosine},
                                                      {"constant", Schedule::Constant}}};
constexpr detail::NameTable<Precision, 3> kPrecisions{{{"float32", Precision::Float32},
                                                       {"bfloat16", Precision::BFloat16},
                                                       {"float64", Precision::Float64}}};
constexpr detail::NameTable<Recipe, 2> kRecipes{{{"paper", Recipe::Paper}, {"none", Recipe::None}}};

constexpr const char* kImageFolder = "imagefolder";

// The values a recipe gives the augmentation fields left at -1 (label smoothing 0.1 and the
// validation resize are the same in both). Paper: timm's DeiT / Swin settings.
struct RecipeValues {
  double rand_augment, color_jitter, reprob, mixup, cutmix;
};
constexpr RecipeValues kPaperRecipe{9.0, 0.4, 0.25, 0.8, 1.0};
constexpr RecipeValues kNoRecipe{0.0, 0.0, 0.0, 0.0, 0.0};
constexpr int64_t kDefaultImageSize = 224;

struct TrainEnums {
  std::string name(OptimizerKind v) const { return to_string(v); }
  std::string name(DecayOn v) const { return to_string(v); }
  std::string name(Schedule v) const { return to_string(v); }
  std::string name(Precision v) const { return to_string(v); }
  std::string name(Recipe v) const { return to_string(v); }
  OptimizerKind parse(const std::string& s, OptimizerKind*) const { return parse_optimizer(s); }
  DecayOn parse(const std::string& s, DecayOn*) const { return parse_decay_on(s); }
  Schedule parse(const std::string& s, Schedule*) const { return parse_schedule(s); }
  Precision parse(const std::string& s, Precision*) const { return parse_precision(s); }
  Recipe parse(const std::string& s, Recipe*) const { return parse_recipe(s); }
};

// The one list of fields that both JSON directions follow, in the order of the struct.
const auto visit_fields = [](auto& c, auto&& visit) {
  visit("model", c.model);
  visit("model_config", c.model_config);
  visit("dataset", c.dataset);
  visit("data_dir", c.data_dir);
  visit("val_labels", c.val_labels);
  visit("strict_data", c.strict_data);
  visit("image_size", c.image_size);
  visit("val_resize", c.val_resize);
  visit("train_subset", c.train_subset);
  visit("val_subset", c.val_subset);
  visit("workers", c.workers);
  visit("prefetch", c.prefetch);
  visit("crop_padding", c.crop_padding);
  visit("hflip", c.hflip);
  visit("recipe", c.recipe);
  visit("scale_min", c.scale_min);
  visit("scale_max", c.scale_max);
  visit("ratio_min", c.ratio_min);
  visit("ratio_max", c.ratio_max);
  visit("rand_augment", c.rand_augment);
  visit("rand_augment_ops", c.rand_augment_ops);
  visit("rand_augment_mstd", c.rand_augment_mstd);
  visit("color_jitter", c.color_jitter);
  visit("reprob", c.reprob);
  visit("mixup", c.mixup);
  visit("cutmix", c.cutmix);
  visit("mixup_switch_prob", c.mixup_switch_prob);
  visit("optimizer", c.optimizer);
  visit("lr", c.lr);
  visit("weight_decay", c.weight_decay);
  visit("decay_on", c.decay_on);
  visit("beta1", c.beta1);
  visit("beta2", c.beta2);
  visit("eps", c.eps);
  visit("momentum", c.momentum);
  visit("nesterov", c.nesterov);
  visit("epochs", c.epochs);
  visit("batch_size", c.batch_size);
  visit("schedule", c.schedule);
  visit("warmup_epochs", c.warmup_epochs);
  visit("warmup_lr", c.warmup_lr);
  visit("min_lr", c.min_lr);
  visit("smoothing", c.smoothing);
  visit("clip_grad", c.clip_grad);
  visit("accum_steps", c.accum_steps);
  visit("precision", c.precision);
  visit("output", c.output);
  visit("experiment", c.experiment);
  visit("seed", c.seed);
  visit("initial_checkpoint", c.initial_checkpoint);
  visit("sync_bn", c.sync_bn);
  visit("world_size", c.world_size);
  visit("dist_backend", c.dist_backend);
  visit("quiet", c.quiet);
  visit("plots", c.plots);
  visit("log_interval", c.log_interval);
};

void check_finite_non_negative(double value, const char* option) {
  TORCH_CHECK(std::isfinite(value) && value >= 0.0, option,
              " must be a finite non-negative number, got ", value);
}

// An augmentation value: -1 (the recipe's), or one that `valid` accepts.
template <typename Valid>
void check_recipe_value(double value, const char* option, const char* rule, Valid valid) {
  TORCH_CHECK(value == -1.0 || (std::isfinite(value) && valid(value)), option, " must be ", rule,
              " (or -1: the recipe's value), got ", value);
}

void check_dataset(const TrainConfig& c) {
  const auto& names = train_dataset_names();
  if (std::find(names.begin(), names.end(), c.dataset) != names.end()) return;
  std::string allowed;
  for (const auto& name : names) allowed += (allowed.empty() ? "" : ", ") + name;
  TORCH_CHECK(false, "dataset must be one of ", allowed, "; got '", c.dataset, "'");
}

void check_augmentation(const TrainConfig& c) {
  TORCH_CHECK(c.scale_min >= 0.0 && c.scale_min <= c.scale_max && c.scale_max > 0.0 &&
                  c.scale_max <= 1.0,
              "scale must be (min, max) with 0 <= min <= max <= 1 and max > 0, got (", c.scale_min,
              ", ", c.scale_max, ")");
  TORCH_CHECK(std::isfinite(c.ratio_max) && c.ratio_min > 0.0 && c.ratio_min <= c.ratio_max,
              "ratio must be a finite (min, max) with 0 < min <= max, got (", c.ratio_min, ", ",
              c.ratio_max, ")");
  check_recipe_value(c.rand_augment, "rand_augment", "a magnitude in [0, 10] (0: off)",
                     [](double v) { return v >= 0.0 && v <= 10.0; });
  TORCH_CHECK(c.rand_augment_ops >= 0, "rand_augment_ops must be >= 0 (0: off), got ",
              c.rand_augment_ops);
  check_finite_non_negative(c.rand_augment_mstd, "rand_augment_mstd");
  const auto non_negative = [](double v) { return v >= 0.0; };
  const auto probability = [](double v) { return v <= 1.0 && v >= 0.0; };
  check_recipe_value(c.color_jitter, "color_jitter", ">= 0 (0: off)", non_negative);
  check_recipe_value(c.reprob, "reprob", "a probability in [0, 1]", probability);
  check_recipe_value(c.mixup, "mixup", "an alpha >= 0 (0: off)", non_negative);
  check_recipe_value(c.cutmix, "cutmix", "an alpha >= 0 (0: off)", non_negative);
  TORCH_CHECK(probability(c.mixup_switch_prob), "mixup_switch_prob must be in [0, 1], got ",
              c.mixup_switch_prob);
}

// Options that mean something for one kind of data set only are errors with the other, rather
// than silently ignored.
void check_image_folder_only(const TrainConfig& c) {
  const auto only = [&](bool unset, const char* option, const auto& value) {
    TORCH_CHECK(unset, option, " applies to dataset imagefolder only (the in-memory data sets keep "
                "their size and train with crop padding and flip), got ", value, " with dataset ",
                c.dataset);
  };
  only(c.image_size == 0, "image_size", c.image_size);
  only(c.val_resize == 0, "val_resize", c.val_resize);
  only(c.val_labels.empty(), "val_labels", c.val_labels);
  only(c.recipe != Recipe::Paper, "recipe paper", "paper");
  only(c.rand_augment <= 0.0, "rand_augment", c.rand_augment);
  only(c.color_jitter <= 0.0, "color_jitter", c.color_jitter);
  only(c.reprob <= 0.0, "reprob", c.reprob);
  const TrainConfig defaults;
  only(c.scale_min == defaults.scale_min && c.scale_max == defaults.scale_max, "scale",
       fmt::format("({}, {})", c.scale_min, c.scale_max));
  only(c.ratio_min == defaults.ratio_min && c.ratio_max == defaults.ratio_max, "ratio",
       fmt::format("({}, {})", c.ratio_min, c.ratio_max));
}

void check_image_folder(const TrainConfig& c) {
  TORCH_CHECK(!c.data_dir.empty(),
              "data_dir must name the root of the image folders (train/ and val/ inside) for "
              "dataset imagefolder");
  TORCH_CHECK(c.crop_padding <= 0, "crop_padding applies to the in-memory data sets; dataset "
              "imagefolder crops with RandomResizedCrop (scale, ratio), got crop_padding ",
              c.crop_padding);
  TORCH_CHECK(c.image_size >= 0, "image_size must be >= 1 (or 0: 224), got ", c.image_size);
  const int64_t size = c.image_size > 0 ? c.image_size : kDefaultImageSize;
  TORCH_CHECK(c.val_resize == 0 || c.val_resize >= size,
              "val_resize must be >= image_size (", size, ") or 0 (image_size / 0.875), got ",
              c.val_resize);
}

// The model as the data set will make it (resolve_config), so that no message shows a value that
// neither the user nor the data gave. An image folder's model sees 3 x image_size crops (224 when
// 0). An in-memory set gives its size only once it is loaded: its model's rules on the image
// size (a ViT's patch_size must divide it) are checked by models::build_model, which the trainer
// calls with the loaded size; here the size is patch_size itself, which those rules accept.
models::ModelConfig model_as_built(const TrainConfig& c) {
  auto m = c.model_config;
  if (is_image_folder(c)) {
    m.in_channels = 3;
    m.image_size = c.image_size > 0 ? c.image_size : kDefaultImageSize;
  } else {
    m.image_size = std::max<int64_t>(m.patch_size, 1);
  }
  return m;
}

}  // namespace

OptimizerKind parse_optimizer(const std::string& name) {
  return detail::parse_name(kOptimizers, name, "optimizer");
}
DecayOn parse_decay_on(const std::string& name) { return detail::parse_name(kDecayOn, name, "decay_on"); }
Schedule parse_schedule(const std::string& name) { return detail::parse_name(kSchedules, name, "schedule"); }
Precision parse_precision(const std::string& name) {
  return detail::parse_name(kPrecisions, name, "precision");
}
std::string to_string(OptimizerKind value) { return detail::name_of(kOptimizers, value); }
std::string to_string(DecayOn value) { return detail::name_of(kDecayOn, value); }
std::string to_string(Schedule value) { return detail::name_of(kSchedules, value); }
std::string to_string(Precision value) { return detail::name_of(kPrecisions, value); }
Recipe parse_recipe(const std::string& name) { return detail::parse_name(kRecipes, name, "recipe"); }
std::string to_string(Recipe value) { return detail::name_of(kRecipes, value); }

const std::vector<std::string>& train_dataset_names() {
  static const std::vector<std::string> names = [] {
    auto all = data::dataset_names();
    all.push_back(kImageFolder);
    return all;
  }();
  return names;
}

bool is_image_folder(const TrainConfig& config) { return config.dataset == kImageFolder; }

TrainConfig apply_recipe(TrainConfig c) {
  if (!c.recipe) c.recipe = is_image_folder(c) ? Recipe::Paper : Recipe::None;
  const auto& values = *c.recipe == Recipe::Paper ? kPaperRecipe : kNoRecipe;
  const auto fill = [](double& field, double value) {
    if (field == -1.0) field = value;
  };
  fill(c.rand_augment, values.rand_augment);
  fill(c.color_jitter, values.color_jitter);
  fill(c.reprob, values.reprob);
  fill(c.mixup, values.mixup);
  fill(c.cutmix, values.cutmix);
  // Digits are not mirror-symmetric.
  if (c.hflip < 0) c.hflip = c.dataset == data::to_string(data::DatasetKind::Mnist) ? 0.0 : 0.5;
  if (is_image_folder(c)) {
    if (c.image_size == 0) c.image_size = kDefaultImageSize;
    if (c.val_resize == 0) c.val_resize = data::default_val_resize(c.image_size);
    if (c.crop_padding < 0) c.crop_padding = 0;
  }
  return c;
}

void to_json(nlohmann::json& json, const TrainConfig& config) {
  json = detail::config_to_json(config, visit_fields, TrainEnums{});
}

void from_json(const nlohmann::json& json, TrainConfig& config) {
  detail::config_from_json(json, config, "train config", visit_fields, TrainEnums{});
}

void validate(const TrainConfig& c) {
  check_dataset(c);
  if (is_image_folder(c)) {
    check_image_folder(c);
  } else {
    check_image_folder_only(c);
  }
  check_augmentation(c);
  models::validate(c.model, model_as_built(c));
  TORCH_CHECK(c.train_subset >= 0, "train_subset must be >= 0 (0: all), got ", c.train_subset);
  TORCH_CHECK(c.val_subset >= 0, "val_subset must be >= 0 (0: all), got ", c.val_subset);
  TORCH_CHECK(c.workers >= 0, "workers must be >= 0, got ", c.workers);
  TORCH_CHECK(c.prefetch >= 1, "prefetch must be >= 1, got ", c.prefetch);
  TORCH_CHECK(c.crop_padding >= -1, "crop_padding must be >= 0 (or -1: the data set's default), got ",
              c.crop_padding);
  TORCH_CHECK(c.hflip == -1.0 || (c.hflip >= 0.0 && c.hflip <= 1.0),
              "hflip must be a probability in [0, 1] (or -1: the data set's default), got ", c.hflip);
  TORCH_CHECK(std::isfinite(c.lr) && c.lr > 0.0, "lr must be a positive finite number, got ", c.lr);
  check_finite_non_negative(c.weight_decay, "weight_decay");
  TORCH_CHECK(c.beta1 >= 0.0 && c.beta1 < 1.0, "beta1 must be in [0, 1), got ", c.beta1);
  TORCH_CHECK(c.beta2 >= 0.0 && c.beta2 < 1.0, "beta2 must be in [0, 1), got ", c.beta2);
  TORCH_CHECK(std::isfinite(c.eps) && c.eps > 0.0, "eps must be a positive finite number, got ", c.eps);
  TORCH_CHECK(c.momentum >= 0.0 && c.momentum < 1.0, "momentum must be in [0, 1), got ", c.momentum);
  TORCH_CHECK(!c.nesterov || (c.optimizer == OptimizerKind::Sgd && c.momentum > 0.0),
              "nesterov needs the sgd optimizer and a momentum > 0 (optimizer ",
              to_string(c.optimizer), ", momentum ", c.momentum, ")");
  TORCH_CHECK(c.epochs >= 1, "epochs must be >= 1, got ", c.epochs);
  TORCH_CHECK(c.world_size >= 1, "world_size must be >= 1, got ", c.world_size);
  // Checkpoints store the config for Python, whose torch.save integers convnn reads as int64.
  TORCH_CHECK(c.seed <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
              "seed must be below 2^63, got ", c.seed);
  TORCH_CHECK(c.batch_size >= 1, "batch_size must be >= 1, got ", c.batch_size);
  check_finite_non_negative(c.warmup_epochs, "warmup_epochs");
  TORCH_CHECK(c.warmup_epochs <= static_cast<double>(c.epochs), "warmup_epochs (", c.warmup_epochs,
              ") must not exceed epochs (", c.epochs, ")");
  check_finite_non_negative(c.warmup_lr, "warmup_lr");
  check_finite_non_negative(c.min_lr, "min_lr");
  TORCH_CHECK(c.min_lr <= c.lr, "min_lr (", c.min_lr, ") must not exceed lr (", c.lr, ")");
  TORCH_CHECK(c.smoothing >= 0.0 && c.smoothing < 1.0, "smoothing must be in [0, 1), got ", c.smoothing);
  check_finite_non_negative(c.clip_grad, "clip_grad");
  TORCH_CHECK(c.accum_steps >= 1, "accum_steps must be >= 1, got ", c.accum_steps);
  TORCH_CHECK(!c.output.empty(), "output must name a directory");
  TORCH_CHECK(c.experiment.find('/') == std::string::npos && c.experiment != "." && c.experiment != "..",
              "experiment must be a plain directory name, got '", c.experiment, "'");
  TORCH_CHECK(c.log_interval >= 1, "log_interval must be >= 1, got ", c.log_interval);
}

TrainConfig read_config(const std::string& path) {
  std::ifstream in(path);
  // A directory opens as an empty stream, which would be reported as bad JSON.
  TORCH_CHECK(in && !std::filesystem::is_directory(path), "config file '", path,
              "' cannot be read (missing, a directory, or not readable)");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    TORCH_CHECK(false, "config file '", path, "' is not valid JSON: ", e.what());
  }
  TrainConfig config;
  try {
    from_json(json, config);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "config file '", path, "': ", e.msg());
  }
  return config;
}

}  // namespace convnn::train
