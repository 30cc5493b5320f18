#pragma once
// Everything a training run is made of, in typed sections (data, augmentation, optimisation,
// run) that the command line, the JSON config file and the run directory's config.json all
// describe. Unset optional values are the recipe's or the data set's. Defaults are the paper's recipe
// (AdamW lr 1e-3, wd 0.05, betas (0.9, 0.999), 20 warm-up epochs from 1e-7 then cosine to 5e-6,
// label smoothing 0.1, gradient clipping 5, bf16 autocast off on the CPU by default).
//
// The config module (src/config, the library convnn_config) sits below the checkpoints, which
// store a run's config, and the trainer, which follows it; the names stay in namespace
// convnn::train, whose run they describe.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "convnn/data/config.h"
#include "convnn/models/registry.h"

namespace convnn::train {

enum class OptimizerKind { AdamW, Sgd };
/// Which parameters weight decay applies to: all of them, or only weights (2-D and higher;
/// never biases, normalisation scales, position embeddings or class tokens).
enum class DecayOn { All, Weights };
enum class Schedule { Cosine, Constant };
/// float64: the model and its inputs in double precision (slow; for numerical checks, such as
/// the data-parallel equivalence test).
enum class Precision { Float32, BFloat16, Float64 };
// The data and augmentation sections are the data library's (data/config.h).
using data::AugmentationConfig;
using data::DataConfig;
using data::Recipe;

OptimizerKind parse_optimizer(const std::string& name);
DecayOn parse_decay_on(const std::string& name);
Schedule parse_schedule(const std::string& name);
Precision parse_precision(const std::string& name);
std::string to_string(OptimizerKind value);
std::string to_string(DecayOn value);
std::string to_string(Schedule value);
std::string to_string(Precision value);
/// Each enum's names in enum order, from the one table that its parse_* and to_string read: what
/// the command line's choices and the tests read.
const std::vector<std::string>& optimizer_names();
const std::vector<std::string>& decay_on_names();
const std::vector<std::string>& schedule_names();
const std::vector<std::string>& precision_names();

/// The optimiser, its schedule and the loss.
struct OptimizationConfig {
  OptimizerKind optimizer = OptimizerKind::AdamW;
  double lr = 1e-3;
  double weight_decay = 0.05;
  DecayOn decay_on = DecayOn::All;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW
  double momentum = 0.9;                          // SGD
  bool nesterov = false;                          // SGD
  int64_t epochs = 300;
  int64_t batch_size = 128;  // per process
  Schedule schedule = Schedule::Cosine;
  double warmup_epochs = 20;
  double warmup_lr = 1e-7;
  double min_lr = 5e-6;
  double smoothing = 0.1;
  double clip_grad = 5.0;                    // max global L2 norm; 0: off
  int64_t accum_steps = 1;                   // batches per optimiser step
  Precision precision = Precision::Float32;  // bfloat16: autocast; float64: all in double
};

/// Where the run lives, its seed and starting point, and how it is spread over processes.
struct RunConfig {
  std::string output = "runs";  // the run directory is output/experiment
  std::string experiment;       // empty: <model>-<dataset>-<date>-<time>
  uint64_t seed = 0;
  // Weights to start from (a convnn checkpoint or a state_dict saved by Python), with a fresh
  // optimiser at epoch 0: fine-tuning. Empty: the seeded initialisation.
  std::string initial_checkpoint;
  // Data parallel: batch norm over the batches of every process (synchronised), rather than each
  // process's own (DDP's default).
  bool sync_bn = false;
  // Set by the trainer, for the record: the processes of the run and their c10d backend ("" for
  // a single process). Not options: a run's world is how it is launched (torchrun).
  int64_t world_size = 1;
  std::string dist_backend;
};

/// Everything a training run is made of.
struct TrainConfig {
  // A registry name and its options. num_classes, in_channels and image_size are taken from the
  // data set.
  std::string model = "resnet18";
  models::ModelConfig model_config;
  DataConfig data;
  AugmentationConfig augmentation;
  OptimizationConfig optimization;
  RunConfig run;
};

/// One flat JSON object with a key per option, named as its flag with '_' for '-' (--opt-betas:
/// "opt_betas"; a pair of numbers is an array [first, second]). The sections are not levels;
/// "model_config" holds the model's options (models::ModelConfig's JSON, keys as the model flags).
/// Where a key is not a flag: "world_size" and "dist_backend" are records of how the run was
/// launched. How the command shows a run (--quiet, --no-plots, --log-interval) is the command's,
/// not the run's: files written before it left the config hold "quiet", "plots" and
/// "log_interval", which reading drops (the command reads them from a --config file itself).
/// Files written before the keys matched
/// the flags hold "optimizer", "schedule", "accum_steps", "eps", "beta1"/"beta2",
/// "scale_min"/"scale_max" and "ratio_min"/"ratio_max": they read as before, and a file giving a
/// former key beside its current one is refused. Unset options are null. Reading accepts any subset and rejects unknown keys and ill-typed values (c10::Error
/// naming the key). Files written before the options were optional hold -1 (crop_padding, hflip,
/// rand_augment, color_jitter, reprob, mixup, cutmix) or 0 (image_size, val_resize) for "unset",
/// and read as unset.
void to_json(nlohmann::json& json, const TrainConfig& config);
void from_json(const nlohmann::json& json, TrainConfig& config);

/// Checks every value (c10::Error naming the option, its value and the rule): train() calls it
/// once, on the config it is given; what it resolves from there is valid by construction.
void validate(const TrainConfig& config);

/// data::apply_recipe on the config's data and augmentation: everything of
/// train::resolve_config that does not need the data.
TrainConfig apply_recipe(TrainConfig config);

/// Reads a JSON config file (c10::Error naming the path on a missing file or bad JSON).
TrainConfig read_config(const std::string& path);
/// The JSON of config file `path`, unread: for a reader that takes keys of its own out first, then
/// reads the rest with read_config(json, path). At most 4 MiB; errors as read_config's.
nlohmann::json read_config_file(const std::string& path);
TrainConfig read_config(const nlohmann::json& json, const std::string& path);

}  // namespace convnn::train
