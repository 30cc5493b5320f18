// `convnn eval`: loads a checkpoint and reports top-1 / top-5 and the confusion matrix (CSV and,
// with gnuplot, PNG) on a split of its data set. A run's checkpoint says which model and data it
// is; weights alone (a state_dict saved by Python) take them from --config or the model flags.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "commands.h"
#include "model_options.h"
#include "convnn/checkpoint/checkpoint.h"
#include "convnn/data/text.h"
#include "convnn/data/datasets.h"
#include "convnn/train/trainer.h"
#include "convnn/util/device.h"
#include "plots.h"
#include "sinks.h"
#include "train_options.h"

namespace convnn::cli {
namespace {

struct EvalArgs {
  std::string checkpoint;
  train::TrainConfig model;  // --config, --dataset and the model flags: for weights alone
  std::string data_dir;
  std::string val_labels;
  std::string split = data::to_string(data::Split::Test);
  std::string output;
  int64_t batch_size = 256;
  int64_t workers = 2;
  bool bf16 = false;
  bool allow_non_finite = false;
  std::string device = "auto";
  std::vector<const CLI::Option*> model_options;
};

// The given flags of those that describe the model, which a run's checkpoint already holds.
std::string given_model_flags(const EvalArgs& a) {
  std::string flags;
  for (const auto* option : a.model_options) {
    if (option->count() > 0) flags += (flags.empty() ? "" : ", ") + option->get_name();
  }
  return flags;
}

train::TrainConfig config_of(const EvalArgs& a, const std::string& path) {
  const auto flags = given_model_flags(a);
  if (!checkpoint::holds_run(path)) return a.model;
  TORCH_CHECK(flags.empty(), "checkpoint '", path, "' holds its run's model and data set: leave out ", flags,
              " (they describe the model of weights alone, such as a state_dict saved by Python)");
  return checkpoint::read_checkpoint_header(path).config;
}

int run_eval(const EvalArgs& a) {
  const auto device = resolve_device(a.device, "--device");  // before the checkpoint is read
  const auto path = resume_checkpoint_path(a.checkpoint);
  auto config = config_of(a, path);
  if (!a.data_dir.empty()) config.data.data_dir = a.data_dir;
  if (!a.val_labels.empty()) config.data.val_labels = a.val_labels;
  config.optimization.batch_size = a.batch_size;
  config.data.workers = a.workers;
  config.data.val_subset = 0;
  config.data.train_subset = 0;
  const auto split = data::parse_split(a.split);
  // Weights alone with neither --config nor a model flag are tried on the default model; when they
  // do not fit it (or cannot be read), the error says how to name their model.
  const bool default_model = given_model_flags(a).empty() && !checkpoint::holds_run(path);
  const auto result = [&] {
    try {
      return train::evaluate_checkpoint(path, config, split,
                                        a.bf16 ? train::Precision::BFloat16 : config.optimization.precision,
                                        a.allow_non_finite, device, print_skipped_sample);
    } catch (const c10::Error& error) {
      if (!default_model) throw;
      // On the message's first line, which is what the command line shows without --verbose.
      const std::string message = error.what_without_backtrace();
      const auto line_end = message.find('\n');
      TORCH_CHECK(false, message.substr(0, line_end), "; the file holds weights alone (no run config naming ",
                  "its model), tried on the default model ", config.model, " for ", config.data.dataset,
                  ": pass --config runs/<run>/config.json, or the model flags (--model, --dataset, ...), to say ",
                  "which model the weights are", line_end == std::string::npos ? "" : message.substr(line_end));
    }
  }();
  const auto output = a.output.empty()
                          ? (std::filesystem::path(path).parent_path() / ("eval-" + a.split)).string()
                          : a.output;
  train::write_confusion(output, result.class_names, result.confusion);
  plot_confusion(output, result.class_names);
  const bool text = data::is_text_dataset(config.data.dataset);
  fmt::print("{} on {} {} ({} {}): top-1 {:.2f}%  top-5 {:.2f}%  loss {:.4f}{}\n", path, config.data.dataset, a.split,
             result.samples, text ? "tokens" : "images", result.top1, result.top5, result.loss,
             text ? fmt::format(" ({:.4f} bits/token)", result.loss / std::log(2.0)) : std::string());
  if (result.skipped > 0) fmt::print("skipped {} unreadable files (see the warnings)\n", result.skipped);
  fmt::print("confusion matrix: {}/confusion.csv{}\n", output,
             std::filesystem::exists(std::filesystem::path(output) / "confusion.png") ? " and confusion.png" : "");
  return 0;
}

// --config, --dataset and the model flags, in the order that lets flags override the file.
void add_weights_only_options(CLI::App* sub, EvalArgs& args) {
  const size_t first = sub->get_options().size();
  sub->add_option_function<std::string>(
      "--config", [&args](const std::string& path) { args.model = train::read_config(path); },
      "Weights alone: JSON config naming the model and data set (keys as in a run's config.json); "
      "flags override it");
  sub->add_option("--dataset", args.model.data.dataset, "Weights alone: data set")
      ->check(CLI::IsMember(data::config_dataset_names()));
  add_trained_model_options(sub, args.model);
  const auto options = sub->get_options();
  for (size_t i = first; i < options.size(); ++i) {
    const_cast<CLI::Option*>(options[i])->group("Model of weights alone (a state_dict saved by Python)");
    args.model_options.push_back(options[i]);
  }
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "Evaluate a checkpoint: top-1, top-5 and the confusion matrix");
  auto args = std::make_shared<EvalArgs>();
  sub->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint file, a run directory (its latest), or a state_dict saved by Python's "
                  "torch.save (then give the model with --config or the model flags)")
      ->required();
  sub->add_option("--data-dir", args->data_dir, "Folder of the data set (unset: the run's)");
  sub->add_option("--val-labels", args->val_labels,
                  "imagefolder: labels file of a flat val/ folder (unset: the run's, else found beside it)");
  sub->add_option("--split", args->split, "Split to evaluate (test: the val/ folder of an imagefolder)")
      ->check(CLI::IsMember(data::split_names()));
  sub->add_option("--output", args->output, "Folder for confusion.csv/png (unset: <run>/eval-<split>)");
  sub->add_option("-b,--batch-size", args->batch_size, "Batch size")->check(integer_at_least(1));
  sub->add_option("-j,--workers", args->workers, "Data loader threads")->check(integer_at_least(0));
  sub->add_flag("--amp", args->bf16, "Evaluate under bfloat16 autocast");
  add_device_option(sub, args->device, "Device to load the checkpoint onto and evaluate on");
  sub->add_flag("--allow-non-finite", args->allow_non_finite,
                "Evaluate a checkpoint whose weights hold NaN or Inf (refused by default)");
  add_weights_only_options(sub, *args);
  sub->footer(
      "Examples:\n"
      "  convnn eval --checkpoint runs/<run>/checkpoint-best.pt\n"
      "  convnn eval --checkpoint weights.pt --config runs/<run>/config.json   # torch.save(model.state_dict())\n"
      "  convnn eval --checkpoint weights.pt --model resnet18 --layer convnn --small-stem --dataset cifar10\n");
  return {sub, [args] { return run_eval(*args); }};
}

}  // namespace convnn::cli
