#pragma once
// The training flags of `convnn train` and `convnn compare`, grouped as timm's train.py groups
// them. A JSON file given with --config (or the config of the checkpoint given with --resume)
// is read first; flags on the command line override it.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "convnn/checkpoint/checkpoint.h"
#include "convnn/config/train_config.h"

namespace convnn::cli {

/// How the command shows a run: its own, not the run's config (a resumed run shows as its flags
/// now say). A --config file may give them, as "quiet", "plots" (the negation of --no-plots) and
/// "log_interval".
struct Presentation {
  bool quiet = false;         // plain log lines instead of a progress bar
  bool plots = true;          // PNG plots through gnuplot (skipped with a warning if absent)
  int64_t log_interval = 50;  // batches between plain log lines
};

struct TrainArgs {
  train::TrainConfig config;
  Presentation presentation;
  std::string config_file;
  // --resume's checkpoint (a file, or a run directory's checkpoint-latest.pt), opened and checked
  // once: its config is `config`'s base, its records what training continues from.
  std::shared_ptr<checkpoint::Resumption> resumed;
  bool allow_non_finite = false;  // resume from a checkpoint holding NaN or Inf
  // Not in `config`: the device is a run-time choice, and a run resumes on any device.
  std::string device = "auto";
};

/// The --device flag of train, eval and compare (convnn::resolve_device reads it); its help is
/// `what`, the accepted values, then `note`.
void add_device_option(CLI::App* sub, std::string& device, const std::string& what,
                       const std::string& note = "");

/// The --help section of the model flags.
inline constexpr const char* kModelGroup = "Model parameters";

/// Registers --model and the model flags of a model trained on a data set (which sets its
/// classes, channels and image size), bound to `config`, in the section kModelGroup.
void add_trained_model_options(CLI::App* sub, train::TrainConfig& config);

/// Registers every training flag on `sub`, bound to `args`.
void add_train_options(CLI::App* sub, TrainArgs& args);

/// The checkpoint file --resume names (a run directory means its checkpoint-latest.pt).
std::string resume_checkpoint_path(const std::string& resume);

}  // namespace convnn::cli
