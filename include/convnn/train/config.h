#pragma once
// Everything a training run is made of, in typed sections (data, augmentation, optimisation,
// run) that the command line, the JSON config file and the run directory's config.json all
// describe. Unset optional values are the recipe's or the data set's. Defaults are the paper's recipe
// (AdamW lr 1e-3, wd 0.05, betas (0.9, 0.999), 20 warm-up epochs from 1e-7 then cosine to 5e-6,
// label smoothing 0.1, gradient clipping 5, bf16 autocast off on the CPU by default).
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
/// The augmentation recipe: the paper's (DeiT / Swin through timm: RandAugment, colour jitter,
/// random erasing, MixUp / CutMix) or none (image folders: RandomResizedCrop and flip only).
enum class Recipe { Paper, None };

OptimizerKind parse_optimizer(const std::string& name);
DecayOn parse_decay_on(const std::string& name);
Schedule parse_schedule(const std::string& name);
Precision parse_precision(const std::string& name);
Recipe parse_recipe(const std::string& name);
std::string to_string(OptimizerKind value);
std::string to_string(DecayOn value);
std::string to_string(Schedule value);
std::string to_string(Precision value);
std::string to_string(Recipe value);

/// The data sets `dataset` accepts: data::dataset_names() (held in memory) and "imagefolder"
/// (ImageNet-style folders of JPEG / PNG files, decoded per sample).
const std::vector<std::string>& train_dataset_names();

/// What a run reads, and how its loader reads it.
struct DataConfig {
  std::string dataset = "fashion-mnist";  // or imagefolder
  std::string data_dir;               // empty: data::default_data_dir; imagefolder: the root of train/, val/
  std::string val_labels;             // imagefolder: labels file of a flat val/ (empty: found beside it)
  bool strict_data = false;           // imagefolder: stop at the first unreadable file (default: skip it)
  std::optional<int64_t> image_size;  // imagefolder: side of the crops; unset: 224 (others: their own)
  std::optional<int64_t> val_resize;  // imagefolder: shorter side before the centre crop; unset: size / 0.875
  int64_t train_subset = 0;           // train on the first n samples of a seeded shuffle; 0: all
  int64_t val_subset = 0;             // evaluate on the first n test samples of a seeded shuffle; 0: all
  int64_t workers = 2;                // loader threads
  int64_t prefetch = 4;               // batches held ready
};

/// The per-sample augmentation. Unset values are the recipe's (paper / none) or the data set's;
/// apply_recipe and resolve_config fill them, so that a run's config.json says what it used.
/// Image folders take every field but crop_padding; the in-memory sets take crop_padding, hflip
/// and MixUp / CutMix.
struct AugmentationConfig {
  std::optional<int64_t>
      crop_padding;              // random crop from the zero-padded image; unset: 4 for 32 px, 2 for 28 px
  std::optional<double> hflip;   // flip probability; unset: 0.5, but 0 for MNIST digits
  std::optional<Recipe> recipe;  // unset: paper for imagefolder, none for the others
  double scale_min = 0.08, scale_max = 1.0;             // RandomResizedCrop area fraction
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // RandomResizedCrop aspect ratio
  std::optional<double> rand_augment;                   // RandAugment magnitude M (paper 9); 0: off
  int64_t rand_augment_ops = 2;                         // RandAugment ops per image; 0: off
  double rand_augment_mstd = 0.5;                       // RandAugment magnitude std; > 100: uniform in [0, M]
  std::optional<double> color_jitter;  // brightness = contrast = saturation strength (paper 0.4)
  std::optional<double> reprob;        // random erasing probability (paper 0.25)
  std::optional<double> mixup;         // MixUp alpha (paper 0.8); 0: off
  std::optional<double> cutmix;        // CutMix alpha (paper 1.0); 0: off
  double mixup_switch_prob = 0.5;      // CutMix instead of MixUp when both are on
};

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
  // For the command's sinks (the library prints nothing), kept so that a resumed run reports as
  // it did.
  bool quiet = false;         // plain log lines instead of a progress bar
  bool plots = true;          // PNG plots through gnuplot (skipped with a warning if absent)
  int64_t log_interval = 50;  // batches between plain log lines
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

/// One flat JSON object with a key per option, named as the flags are (the sections are not
/// levels; "model_config" holds the model's options, models::ModelConfig's JSON). Unset options
/// are null. Reading accepts any subset and rejects unknown keys and ill-typed values (c10::Error
/// naming the key). Files written before the options were optional hold -1 (crop_padding, hflip,
/// rand_augment, color_jitter, reprob, mixup, cutmix) or 0 (image_size, val_resize) for "unset",
/// and read as unset.
void to_json(nlohmann::json& json, const TrainConfig& config);
void from_json(const nlohmann::json& json, TrainConfig& config);

/// Checks every value (c10::Error naming the option, its value and the rule): train() calls it
/// once, on the config it is given; what it resolves from there is valid by construction.
void validate(const TrainConfig& config);

bool is_image_folder(const TrainConfig& config);

/// The recipe's values for every unset augmentation field, the recipe itself when unset, the
/// flip probability, and for imagefolder the image size, validation resize and crop padding (0):
/// everything of train::resolve_config that does not need the data.
TrainConfig apply_recipe(TrainConfig config);

/// Reads a JSON config file (c10::Error naming the path on a missing file or bad JSON).
TrainConfig read_config(const std::string& path);

}  // namespace convnn::train
