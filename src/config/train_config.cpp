#include "convnn/config/train_config.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <iterator>
#include <sstream>
#include <utility>

#include "convnn/data/text.h"
#include "util/enum_names.h"
#include "util/json_fields.h"
#include "util/value_checks.h"

namespace convnn::train {
namespace {

constexpr detail::NameTable<OptimizerKind, 2> kOptimizers{{{"adamw", OptimizerKind::AdamW},
                                                            {"sgd", OptimizerKind::Sgd}}};
constexpr detail::NameTable<DecayOn, 2> kDecayOn{{{"all", DecayOn::All}, {"weights", DecayOn::Weights}}};
constexpr detail::NameTable<Schedule, 2> kSchedules{{{"cosine", Schedule::Cosine},
                                                      {"constant", Schedule::Constant}}};
constexpr detail::NameTable<Precision, 3> kPrecisions{
    {{"float32", Precision::Float32}, {"bfloat16", Precision::BFloat16}, {"float64", Precision::Float64}}};

struct TrainEnums {
  std::string name(OptimizerKind v) const { return to_string(v); }
  std::string name(DecayOn v) const { return to_string(v); }
  std::string name(Schedule v) const { return to_string(v); }
  std::string name(Precision v) const { return to_string(v); }
  std::string name(Recipe v) const { return data::to_string(v); }
  OptimizerKind parse(const std::string& s, OptimizerKind*) const { return parse_optimizer(s); }
  DecayOn parse(const std::string& s, DecayOn*) const { return parse_decay_on(s); }
  Schedule parse(const std::string& s, Schedule*) const { return parse_schedule(s); }
  Precision parse(const std::string& s, Precision*) const { return parse_precision(s); }
  Recipe parse(const std::string& s, Recipe*) const { return data::parse_recipe(s); }
};

// The one list of fields that both JSON directions follow, in the order of the structs. The
// JSON is flat: a key per option, named as its flag with '_' for '-' (as timm's args.yaml);
// kFormerKeys lists the names files written before held.
const auto visit_fields = [](auto& c, auto&& visit) {
  visit("model", c.model);
  visit("model_config", c.model_config);
  visit("dataset", c.data.dataset);
  visit("data_dir", c.data.data_dir);
  visit("val_labels", c.data.val_labels);
  visit("strict_data", c.data.strict_data);
  visit("max_image_pixels", c.data.max_image_pixels);
  visit("image_size", c.data.image_size);
  visit("val_resize", c.data.val_resize);
  visit("train_subset", c.data.train_subset);
  visit("val_subset", c.data.val_subset);
  visit("workers", c.data.workers);
  visit("prefetch", c.data.prefetch);
  visit("crop_padding", c.augmentation.crop_padding);
  visit("hflip", c.augmentation.hflip);
  visit("recipe", c.augmentation.recipe);
  visit("scale", detail::field_pair(c.augmentation.scale_min, c.augmentation.scale_max));
  visit("ratio", detail::field_pair(c.augmentation.ratio_min, c.augmentation.ratio_max));
  visit("rand_augment", c.augmentation.rand_augment);
  visit("rand_augment_ops", c.augmentation.rand_augment_ops);
  visit("rand_augment_mstd", c.augmentation.rand_augment_mstd);
  visit("color_jitter", c.augmentation.color_jitter);
  visit("reprob", c.augmentation.reprob);
  visit("mixup", c.augmentation.mixup);
  visit("cutmix", c.augmentation.cutmix);
  visit("mixup_switch_prob", c.augmentation.mixup_switch_prob);
  visit("opt", c.optimization.optimizer);
  visit("lr", c.optimization.lr);
  visit("weight_decay", c.optimization.weight_decay);
  visit("decay_on", c.optimization.decay_on);
  visit("opt_betas", detail::field_pair(c.optimization.beta1, c.optimization.beta2));
  visit("opt_eps", c.optimization.eps);
  visit("momentum", c.optimization.momentum);
  visit("nesterov", c.optimization.nesterov);
  visit("epochs", c.optimization.epochs);
  visit("batch_size", c.optimization.batch_size);
  visit("sched", c.optimization.schedule);
  visit("warmup_epochs", c.optimization.warmup_epochs);
  visit("warmup_lr", c.optimization.warmup_lr);
  visit("min_lr", c.optimization.min_lr);
  visit("smoothing", c.optimization.smoothing);
  visit("clip_grad", c.optimization.clip_grad);
  visit("grad_accum_steps", c.optimization.accum_steps);
  visit("precision", c.optimization.precision);
  visit("output", c.run.output);
  visit("experiment", c.run.experiment);
  visit("seed", c.run.seed);
  visit("initial_checkpoint", c.run.initial_checkpoint);
  visit("sync_bn", c.run.sync_bn);
  visit("world_size", c.run.world_size);
  visit("dist_backend", c.run.dist_backend);
};

// The command's presentation (its --quiet, --no-plots, --log-interval), which configs written
// before it left the run's config hold: dropped on reading.
constexpr const char* kFormerPresentationKeys[] = {"quiet", "plots", "log_interval"};

nlohmann::json without_presentation(nlohmann::json json) {
  if (!json.is_object()) return json;
  for (const char* key : kFormerPresentationKeys) json.erase(key);
  return json;
}

// Files written before these options were optional hold these values for "unset".
constexpr std::pair<const char*, double> kLegacyUnset[] = {
    {"image_size", 0},    {"val_resize", 0}, {"crop_padding", -1}, {"hflip", -1}, {"rand_augment", -1},
    {"color_jitter", -1}, {"reprob", -1},    {"mixup", -1},        {"cutmix", -1}};

nlohmann::json without_legacy_sentinels(nlohmann::json json) {
  if (!json.is_object()) return json;
  for (const auto& [key, unset] : kLegacyUnset) {
    if (json.contains(key) && json[key].is_number() && json[key].get<double>() == unset) json[key] = nullptr;
  }
  return json;
}

// Keys that files written before the keys were named as the flags hold, with the key each became.
// A pair's two former keys (beta1, beta2) became one key of two numbers (opt_betas).
struct FormerKey {
  const char* former;
  const char* key;
};
constexpr FormerKey kFormerKeys[] = {{"optimizer", "opt"}, {"schedule", "sched"}, {"accum_steps", "grad_accum_steps"},
                                     {"eps", "opt_eps"}};
struct FormerPair {
  const char *first, *second, *key;
};
constexpr FormerPair kFormerPairs[] = {
    {"beta1", "beta2", "opt_betas"}, {"scale_min", "scale_max", "scale"}, {"ratio_min", "ratio_max", "ratio"}};

void check_not_both(const nlohmann::json& json, const char* former, const char* key) {
  TORCH_CHECK(!json.contains(key), "train config: '", former, "' is the former name of '", key,
              "'; give only '", key, "'");
}

// `json` with the former keys under their keys. A pair's former key that is missing keeps
// `config`'s value, as any key left out does.
nlohmann::json with_current_keys(nlohmann::json json, const TrainConfig& config) {
  if (!json.is_object()) return json;
  for (const auto& [former, key] : kFormerKeys) {
    if (!json.contains(former)) continue;
    check_not_both(json, former, key);
    json[key] = json[former];
    json.erase(former);
  }
  const auto& o = config.optimization;
  const auto& a = config.augmentation;
  const std::pair<double, double> current[] = {{o.beta1, o.beta2}, {a.scale_min, a.scale_max}, {a.ratio_min, a.ratio_max}};
  for (size_t i = 0; i < std::size(kFormerPairs); ++i) {
    const auto& [first, second, key] = kFormerPairs[i];
    auto pair = nlohmann::json::array({current[i].first, current[i].second});
    bool given = false;
    for (const auto* former : {first, second}) {
      if (!json.contains(former)) continue;
      check_not_both(json, former, key);
      TORCH_CHECK(json[former].is_number(), "train config: ", former, " must be a number, got ",
                  detail::shown(json[former]));
      pair[former == first ? 0 : 1] = json[former];
      json.erase(former);
      given = true;
    }
    if (given) json[key] = pair;
  }
  return json;
}

void check_optimization(const OptimizationConfig& o) {
  TORCH_CHECK(std::isfinite(o.lr) && o.lr > 0.0, "lr must be a positive finite number, got ", o.lr);
  detail::check_finite_non_negative(o.weight_decay, "weight_decay");
  TORCH_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0, "beta1 must be in [0, 1), got ", o.beta1);
  TORCH_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0, "beta2 must be in [0, 1), got ", o.beta2);
  TORCH_CHECK(std::isfinite(o.eps) && o.eps > 0.0, "eps must be a positive finite number, got ", o.eps);
  TORCH_CHECK(o.momentum >= 0.0 && o.momentum < 1.0, "momentum must be in [0, 1), got ", o.momentum);
  TORCH_CHECK(!o.nesterov || (o.optimizer == OptimizerKind::Sgd && o.momentum > 0.0),
              "nesterov needs the sgd optimizer and a momentum > 0 (optimizer ", to_string(o.optimizer),
              ", momentum ", o.momentum, ")");
  TORCH_CHECK(o.epochs >= 1, "epochs must be >= 1, got ", o.epochs);
  TORCH_CHECK(o.batch_size >= 1, "batch_size must be >= 1, got ", o.batch_size);
  detail::check_finite_non_negative(o.warmup_epochs, "warmup_epochs");
  TORCH_CHECK(o.warmup_epochs <= static_cast<double>(o.epochs), "warmup_epochs (", o.warmup_epochs,
              ") must not exceed epochs (", o.epochs, ")");
  detail::check_finite_non_negative(o.warmup_lr, "warmup_lr");
  detail::check_finite_non_negative(o.min_lr, "min_lr");
  TORCH_CHECK(o.min_lr <= o.lr, "min_lr (", o.min_lr, ") must not exceed lr (", o.lr, ")");
  TORCH_CHECK(o.smoothing >= 0.0 && o.smoothing < 1.0, "smoothing must be in [0, 1), got ", o.smoothing);
  detail::check_finite_non_negative(o.clip_grad, "clip_grad");
  TORCH_CHECK(o.accum_steps >= 1, "accum_steps must be >= 1, got ", o.accum_steps);
}

void check_run(const RunConfig& r) {
  TORCH_CHECK(r.world_size >= 1, "world_size must be >= 1, got ", r.world_size);
  // Checkpoints store the config for Python, whose torch.save integers convnn reads as int64.
  TORCH_CHECK(r.seed <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
              "seed must be below 2^63, got ", r.seed);
  TORCH_CHECK(!r.output.empty(), "output must name a directory");
  TORCH_CHECK(r.experiment.find('/') == std::string::npos && r.experiment != "." && r.experiment != "..",
              "experiment must be a plain directory name, got '", r.experiment, "'");
}

// The model as the data set will make it (resolve_config), so that no message shows a value that
// neither the user nor the data gave. An image folder's model sees 3 x image_size crops (224 when
// unset). An in-memory set gives its size only once it is loaded: its model's rules on the image
// size (a ViT's patch_size must divide it) are checked by models::build_model, which the trainer
// calls with the loaded size; here the size is patch_size itself, which those rules accept.
models::ModelConfig model_as_built(const TrainConfig& c) {
  auto m = c.model_config;
  if (data::is_text_dataset(c.data.dataset)) return m;  // a language model reads no image
  if (data::is_image_folder(c.data)) {
    m.in_channels = 3;
    m.image_size = c.data.image_size.value_or(data::kDefaultFolderImageSize);
  } else {
    m.image_size = std::max<int64_t>(m.vit.patch_size, 1);
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
const std::vector<std::string>& optimizer_names() { return detail::table_names<kOptimizers>(); }
const std::vector<std::string>& decay_on_names() { return detail::table_names<kDecayOn>(); }
const std::vector<std::string>& schedule_names() { return detail::table_names<kSchedules>(); }
const std::vector<std::string>& precision_names() { return detail::table_names<kPrecisions>(); }

TrainConfig apply_recipe(TrainConfig config) {
  data::apply_recipe(config.data, config.augmentation);
  return config;
}

void to_json(nlohmann::json& json, const TrainConfig& config) {
  json = detail::config_to_json(config, visit_fields, TrainEnums{});
}

void from_json(const nlohmann::json& json, TrainConfig& config) {
  detail::config_from_json(with_current_keys(without_legacy_sentinels(without_presentation(json)), config), config,
                           "train config", visit_fields, TrainEnums{});
}

// Language models read text, the other models images.
void check_model_reads_data(const TrainConfig& c) {
  const bool language = models::model_entry(c.model).family == models::ModelFamily::LanguageModel;
  const bool text = data::is_text_dataset(c.data.dataset);
  TORCH_CHECK(language == text, "model ", c.model, language ? " is a language model: it trains on a text data set ("
                                                            : " reads images: it cannot train on the text data set ",
              language ? fmt::format("{}), got dataset {}", fmt::join(data::text_dataset_names(), ", "), c.data.dataset)
                       : c.data.dataset);
}

void validate(const TrainConfig& c) {
  data::validate(c.data, c.augmentation);
  check_model_reads_data(c);
  models::validate(c.model, model_as_built(c));
  check_optimization(c.optimization);
  check_run(c.run);
}

TrainConfig read_config(const std::string& path) { return read_config(read_config_file(path), path); }

TrainConfig read_config(const nlohmann::json& json, const std::string& path) {
  TrainConfig config;
  try {
    from_json(json, config);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "config file '", path, "': ", e.msg());
  }
  return config;
}

nlohmann::json read_config_file(const std::string& path) {
  // A config is a few KB; the cap stops a read of /dev/zero or of a huge file before it costs memory.
  constexpr std::streamsize kMaxConfigBytes = std::streamsize{4} << 20;
  std::ifstream in(path, std::ios::binary);
  // A directory opens as an empty stream, which would be reported as bad JSON.
  TORCH_CHECK(in && !std::filesystem::is_directory(path), "config file '", path,
              "' cannot be read (missing, a directory, or not readable)");
  std::string text(static_cast<size_t>(kMaxConfigBytes) + 1, '\0');
  in.read(text.data(), kMaxConfigBytes + 1);
  TORCH_CHECK(in.gcount() <= kMaxConfigBytes, "config file '", path, "' is larger than ", kMaxConfigBytes >> 20,
              " MiB, which no config is");
  text.resize(static_cast<size_t>(in.gcount()));
  return detail::parse_json(text, "config file '" + path + "'");
}

}  // namespace convnn::train
