#include "convnn/train/config.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "convnn/data/datasets.h"
#include "util/enum_names.h"
#include "util/json_fields.h"

namespace convnn::train {
namespace {

constexpr detail::NameTable<OptimizerKind, 2> kOptimizers{{{"adamw", OptimizerKind::AdamW},
                                                            {"sgd", OptimizerKind::Sgd}}};
constexpr detail::NameTable<DecayOn, 2> kDecayOn{{{"all", DecayOn::All}, {"weights", DecayOn::Weights}}};
constexpr detail::NameTable<Schedule, 2> kSchedules{{{"cosine", Schedule::Cosine},
                                                      {"constant", Schedule::Constant}}};
constexpr detail::NameTable<Precision, 2> kPrecisions{{{"float32", Precision::Float32},
                                                       {"bfloat16", Precision::BFloat16}}};

struct TrainEnums {
  std::string name(OptimizerKind v) const { return to_string(v); }
  std::string name(DecayOn v) const { return to_string(v); }
  std::string name(Schedule v) const { return to_string(v); }
  std::string name(Precision v) const { return to_string(v); }
  OptimizerKind parse(const std::string& s, OptimizerKind*) const { return parse_optimizer(s); }
  DecayOn parse(const std::string& s, DecayOn*) const { return parse_decay_on(s); }
  Schedule parse(const std::string& s, Schedule*) const { return parse_schedule(s); }
  Precision parse(const std::string& s, Precision*) const { return parse_precision(s); }
};

// The one list of fields that both JSON directions follow, in the order of the struct.
const auto visit_fields = [](auto& c, auto&& visit) {
  visit("model", c.model);
  visit("model_config", c.model_config);
  visit("dataset", c.dataset);
  visit("data_dir", c.data_dir);
  visit("train_subset", c.train_subset);
  visit("val_subset", c.val_subset);
  visit("workers", c.workers);
  visit("prefetch", c.prefetch);
  visit("crop_padding", c.crop_padding);
  visit("hflip", c.hflip);
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
  visit("quiet", c.quiet);
  visit("plots", c.plots);
  visit("log_interval", c.log_interval);
};

void check_finite_non_negative(double value, const char* option) {
  TORCH_CHECK(std::isfinite(value) && value >= 0.0, option,
              " must be a finite non-negative number, got ", value);
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

void to_json(nlohmann::json& json, const TrainConfig& config) {
  json = detail::config_to_json(config, visit_fields, TrainEnums{});
}

void from_json(const nlohmann::json& json, TrainConfig& config) {
  detail::config_from_json(json, config, "train config", visit_fields, TrainEnums{});
}

void validate(const TrainConfig& c) {
  data::parse_dataset(c.dataset);
  models::validate(c.model, c.model_config);
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
  TORCH_CHECK(in, "config file '", path, "' cannot be read (missing or not readable)");
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
