// `convnn train`: trains a registry model on a data set into a run directory (config, metrics,
// plots, checkpoints). Ctrl-C saves the position and exits; --resume continues exactly.
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "convnn/train/checkpoint.h"
#include "convnn/train/trainer.h"
#include "convnn/util/device.h"
#include "train_options.h"

namespace convnn::cli {
namespace {

std::atomic<bool> interrupt_requested{false};

// The first Ctrl-C asks for a clean stop; a second one ends the process at once.
extern "C" void on_interrupt(int) {
  interrupt_requested = true;
  std::signal(SIGINT, SIG_DFL);
}

// --resume continues the same model: flags may change the schedule or the data, not the model.
void check_same_model(const train::TrainConfig& requested, const std::string& checkpoint) {
  const auto stored = train::read_checkpoint_header(checkpoint).config;
  const auto model_of = [](const train::TrainConfig& c) {
    auto m = c.model_config;
    m.num_classes = m.in_channels = m.image_size = 0;  // taken from the data set
    return nlohmann::json{{"model", c.model}, {"model_config", m}};
  };
  const auto wanted = model_of(requested), held = model_of(stored);
  std::string differences;
  for (const auto& [key, value] : held["model_config"].items()) {
    if (wanted["model_config"][key] != value) {
      differences += fmt::format("{}{}: {} in the checkpoint, {} asked", differences.empty() ? "" : "; ", key,
                                 value.dump(), wanted["model_config"][key].dump());
    }
  }
  if (wanted["model"] != held["model"]) {
    differences = fmt::format("model: {} in the checkpoint, {} asked", held["model"].dump(), wanted["model"].dump());
  }
  TORCH_CHECK(differences.empty(), "checkpoint '", checkpoint, "' holds another model (", differences,
              "); drop the model flags to resume it");
}

void print_summary(const train::TrainResult& r) {
  const auto plots = std::filesystem::path(r.run_dir) / "plots";
  if (r.interrupted) return;
  fmt::print("\ntest top-1 {:.2f}%  top-5 {:.2f}%  (best top-1 {:.2f}% at epoch {})\n", r.final_eval.top1,
             r.final_eval.top5, r.best_top1, r.best_epoch);
  fmt::print("run directory: {}\n", r.run_dir);
  fmt::print("  metrics:     {}/metrics.csv, metrics.json\n", r.run_dir);
  if (std::filesystem::exists(plots / "accuracy.png")) {
    fmt::print("  plots:       {}/{{loss,accuracy,lr}}.png\n", plots.string());
  }
  fmt::print("  checkpoints: {} (best: {})\n", train::latest_checkpoint_path(r.run_dir),
             train::best_checkpoint_path(r.run_dir));
  fmt::print("evaluate with: convnn eval --checkpoint {}\n", train::best_checkpoint_path(r.run_dir));
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "Train a model (ResNet with ConvNN / branching layers, ViT with "
                                          "MHSA / KVT / ConvNN attention) on an image data set");
  auto args = std::make_shared<TrainArgs>();
  add_train_options(sub, *args);
  // Here, not in add_train_options: `convnn compare` loads no checkpoint it did not just write.
  sub->add_flag("--allow-non-finite", args->allow_non_finite,
                "With --resume: load a checkpoint whose weights or optimiser state hold NaN or Inf "
                "(refused by default)")
      ->needs(sub->get_option("--resume"))
      ->group("Run");
  sub->footer(
      "Examples:\n"
      "  convnn train --model resnet18 --layer branching --small-stem --width 16 --epochs 3 \\\n"
      "      --warmup-epochs 0.5 --lr 2e-3\n"
      "  convnn train --config configs/fashion-mnist.json --seed 1\n"
      "  convnn train --resume runs/<run>          # after Ctrl-C or a crash\n"
      "  convnn train --config configs/fashion-mnist.json --initial-checkpoint weights.pt  # fine-tune\n");
  return {sub, [args] {
            // First: a device that is not there must fail before any file is read or written.
            const auto device = resolve_device(args->device, "--device");
            if (!args->resume.empty()) check_same_model(args->config, args->resume);
            fmt::print("device: {}\n", device_name(device));
            interrupt_requested = false;
            auto previous = std::signal(SIGINT, on_interrupt);
            train::TrainHooks hooks;
            hooks.stop = &interrupt_requested;
            train::TrainResult result;
            try {
              result = train::train(args->config, args->resume, hooks, args->allow_non_finite, device);
            } catch (...) {
              std::signal(SIGINT, previous);
              throw;
            }
            std::signal(SIGINT, previous);
            print_summary(result);
            return result.interrupted ? 130 : 0;
          }};
}

}  // namespace convnn::cli
