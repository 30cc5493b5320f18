#pragma once
// Everything a training run is made of, as one struct that the command line, the JSON config
// file and the run directory's config.json all describe. Defaults are the paper's recipe
// (AdamW lr 1e-3, wd 0.05, betas (0.9, 0.999), 20 warm-up epochs from 1e-7 then cosine to 5e-6,
// label smoothing 0.1, gradient clipping 5, bf16 autocast off on the CPU by default).
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

#include "convnn/models/registry.h"

namespace convnn::train {

enum class OptimizerKind { AdamW, Sgd };
/// Which parameters weight decay applies to: all of them, or only weights (2-D and higher;
/// never biases, normalisation scales, position embeddings or class tokens).
enum class DecayOn { All, Weights };
enum class Schedule { Cosine, Constant };
enum class Precision { Float32, BFloat16 };

OptimizerKind parse_optimizer(const std::string& name);
DecayOn parse_decay_on(const std::string& name);
Schedule parse_schedule(const std::string& name);
Precision parse_precision(const std::string& name);
std::string to_string(OptimizerKind value);
std::string to_string(DecayOn value);
std::string to_string(Schedule value);
std::string to_string(Precision value);

struct TrainConfig {
  // Model: a registry name and its options (models::ModelConfig). num_classes, in_channels and
  // image_size are taken from the data set.
  std::string model = "resnet18";
  models::ModelConfig model_config;

  // Data.
  std::string dataset = "fashion-mnist";
  std::string data_dir;       // empty: data::default_data_dir
  int64_t train_subset = 0;   // train on the first n samples of a seeded shuffle; 0: all
  int64_t val_subset = 0;     // evaluate on the first n test samples of a seeded shuffle; 0: all
  int64_t workers = 2;        // loader threads
  int64_t prefetch = 4;       // batches held ready
  int64_t crop_padding = -1;  // random crop from the zero-padded image; -1: 4 for 32 px, 2 for 28 px
  double hflip = -1;          // flip probability; -1: 0.5, but 0 for MNIST digits

  // Optimisation.
  OptimizerKind optimizer = OptimizerKind::AdamW;
  double lr = 1e-3;
  double weight_decay = 0.05;
  DecayOn decay_on = DecayOn::All;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW
  double momentum = 0.9;                          // SGD
  bool nesterov = false;                          // SGD
  int64_t epochs = 300;
  int64_t batch_size = 128;
  Schedule schedule = Schedule::Cosine;
  double warmup_epochs = 20;
  double warmup_lr = 1e-7;
  double min_lr = 5e-6;
  double smoothing = 0.1;
  double clip_grad = 5.0;      // max global L2 norm; 0: off
  int64_t accum_steps = 1;     // batches per optimiser step
  Precision precision = Precision::Float32;  // bfloat16: autocast

  // Run.
  std::string output = "runs";  // the run directory is output/experiment
  std::string experiment;       // empty: <model>-<dataset>-<date>-<time>
  uint64_t seed = 0;
  bool quiet = false;           // plain log lines instead of a progress bar
  bool plots = true;            // PNG plots through gnuplot (skipped with a warning if absent)
  int64_t log_interval = 50;    // batches between plain log lines
};

/// One key per field ("model_config" holds the model options); reading accepts any subset and
/// rejects unknown keys and ill-typed values (c10::Error naming the key).
void to_json(nlohmann::json& json, const TrainConfig& config);
void from_json(const nlohmann::json& json, TrainConfig& config);

/// Checks every value (c10::Error naming the option, its value and the rule).
void validate(const TrainConfig& config);

/// Reads a JSON config file (c10::Error naming the path on a missing file or bad JSON).
TrainConfig read_config(const std::string& path);

}  // namespace convnn::train
