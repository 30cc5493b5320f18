// `convnn train`: trains a registry model on a data set into a run directory (config, metrics,
// plots, checkpoints). Ctrl-C saves the position and exits; --resume continues exactly.
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "model_options.h"
#include "convnn/dist/process_group.h"
#include "convnn/checkpoint/checkpoint.h"
#include "convnn/data/text.h"
#include "convnn/train/trainer.h"
#include "convnn/util/device.h"
#include "local_ranks.h"
#include "sinks.h"
#include "train_options.h"

namespace convnn::cli {
namespace {

std::atomic<bool> interrupt_requested{false};

// The first Ctrl-C (or SIGTERM, which torchrun sends its workers when it is interrupted) asks
// for a clean stop; a second one ends the process at once.
extern "C" void on_interrupt(int signal) {
  interrupt_requested = true;
  std::signal(signal, SIG_DFL);
}

struct DistArgs {
  std::string backend = "auto";
  double timeout_s = 300.0;
};

// The process group torchrun's environment describes, or none for a single process.
std::unique_ptr<dist::ProcessGroup> join_group(const DistArgs& a, const c10::Device& device) {
  const auto environment = dist::environment_from_variables();
  if (!environment) return nullptr;
  const auto backend = dist::parse_backend(a.backend, device, "--dist-backend");
  return dist::ProcessGroup::join(*environment, backend,
                                  std::chrono::milliseconds(static_cast<int64_t>(a.timeout_s * 1000)));
}

// Under torchrun, "cuda" means this node's GPU of the process: cuda:LOCAL_RANK.
c10::Device device_of_rank(const c10::Device& device) {
  const auto environment = dist::environment_from_variables();
  if (!device.is_cuda() || device.has_index() || !environment) return device;
  return resolve_device("cuda:" + std::to_string(environment->local_rank), "--device (cuda:LOCAL_RANK)");
}


// --resume continues the same model: flags may change the schedule or the data, not the model.
void check_same_model(const train::TrainConfig& requested, const checkpoint::Resumption& resumed) {
  const auto& stored = resumed.config();
  const auto& checkpoint = resumed.path();
  const auto model_of = [](const train::TrainConfig& c) {
    auto m = c.model_config;
    m.num_classes.reset();  // taken from the data set
    m.in_channels = m.image_size = 0;
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

void print_summary(const train::TrainResult& r, bool text) {
  const auto plots = std::filesystem::path(r.run_dir) / "plots";
  if (r.interrupted) return;
  if (r.final_eval.samples == 0) {
    // --resume of a run that had finished: no epoch ran, so there is no evaluation of this call.
    fmt::print("\nnothing to train: the run had finished its {} epochs; its metrics are in {}/metrics.csv\n",
               r.epochs.size(), r.run_dir);
    return;
  }
  if (text) {
    fmt::print("\nvalidation loss {:.4f} ({:.4f} bits/token)  next-token top-1 {:.2f}%  top-5 {:.2f}%\n",
               r.final_eval.loss, r.final_eval.loss / std::log(2.0), r.final_eval.top1, r.final_eval.top5);
  } else {
    fmt::print("\ntest top-1 {:.2f}%  top-5 {:.2f}%  (best top-1 {:.2f}% at epoch {})\n", r.final_eval.top1,
               r.final_eval.top5, r.best_top1, r.best_epoch);
  }
  fmt::print("run directory: {}\n", r.run_dir);
  fmt::print("  metrics:     {}/metrics.csv, metrics.json\n", r.run_dir);
  if (std::filesystem::exists(plots / "accuracy.png")) {
    fmt::print("  plots:       {}/{{loss,accuracy,lr}}.png\n", plots.string());
  }
  fmt::print("  checkpoints: {} (best: {})\n", checkpoint::latest_checkpoint_path(r.run_dir),
             checkpoint::best_checkpoint_path(r.run_dir));
  fmt::print("evaluate with: convnn eval --checkpoint {}\n", checkpoint::best_checkpoint_path(r.run_dir));
  if (text) {
    fmt::print("sample with:   convnn generate --checkpoint {} --prompt \"...\"\n",
               checkpoint::latest_checkpoint_path(r.run_dir));
  }
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto* sub = app.add_subcommand("train", "Train a model (ResNet with ConvNN / branching layers, ViT with "
                                          "MHSA / KVT / ConvNN attention) on an image data set, or a "
                                          "language model on a text data set");
  auto args = std::make_shared<TrainArgs>();
  add_train_options(sub, *args);
  // Here, not in add_train_options: `convnn compare` loads no checkpoint it did not just write.
  auto dist_args = std::make_shared<DistArgs>();
  auto backends = dist::backend_names();
  backends.insert(backends.begin(), "auto");
  sub->add_option("--dist-backend", dist_args->backend,
                  "Data parallel (under torchrun): c10d backend; auto: nccl on CUDA, gloo on the CPU")
      ->check(CLI::IsMember(backends))
      ->group("Distributed");
  auto nproc = std::make_shared<int64_t>(0);
  sub->add_option("--nproc", *nproc,
                  "Data parallel on this machine without torchrun: start N processes of this command "
                  "(as torchrun --nproc-per-node N would)")
      ->check(integer_at_least(1))
      ->default_str("")  // its 0 means "not given"
      ->group("Distributed");
  sub->add_flag(
         "--sync-bn", args->config.run.sync_bn,
         "Data parallel: batch norm with the statistics of every process's batch (PyTorch's SyncBatchNorm) "
         "instead of each process's own")
      ->group("Distributed");
  sub->add_option("--dist-timeout", dist_args->timeout_s,
                  "Data parallel: seconds to wait for the rendezvous, and for a collective before the other "
                  "processes count as gone")
      ->check(explicit_value("300 s"))
      ->group("Distributed");
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
      "  convnn train --config configs/fashion-mnist.json --initial-checkpoint weights.pt  # fine-tune\n"
      "  torchrun --nproc-per-node 2 --no-python build/bin/convnn train --config configs/fashion-mnist.json --batch-size 64\n"
      "  convnn train --nproc 2 --config configs/fashion-mnist.json --batch-size 64   # the same, without torchrun\n");
  return {sub, [args, dist_args, nproc] {
            if (*nproc > 0) {
              TORCH_CHECK(!dist::environment_from_variables(), "--nproc starts its own processes; under "
                          "torchrun (WORLD_SIZE is set) leave it out");
              return run_local_ranks(*nproc, without_nproc(command_arguments()));
            }
            // First: a device that is not there must fail before any file is read or written.
            const auto device = device_of_rank(resolve_device(args->device, "--device"));
            if (args->resumed) check_same_model(args->config, *args->resumed);
            const auto group = join_group(*dist_args, device);
            const bool main = group == nullptr || group->is_main();
            if (main) {
              fmt::print("device: {}, {}\n", device_name(device),
                         group == nullptr ? "1 process"
                                          : fmt::format("{} processes ({}, --dist-timeout {} s)", group->world_size(),
                                                        dist::to_string(group->backend()), dist_args->timeout_s));
              std::fflush(stdout);
            }
            interrupt_requested = false;
            auto previous_int = std::signal(SIGINT, on_interrupt);
            auto previous_term = std::signal(SIGTERM, on_interrupt);
            const auto restore = [&] {
              std::signal(SIGINT, previous_int);
              std::signal(SIGTERM, previous_term);
            };
            train::TrainHooks hooks;
            hooks.stop = &interrupt_requested;
            const bool text = data::is_text_dataset(args->config.data.dataset);
            ConsoleSink console(args->presentation.quiet, args->presentation.log_interval, text);
            PlotSink plots;
            hooks.sinks.push_back(&console);
            if (args->presentation.plots) hooks.sinks.push_back(&plots);
            train::TrainResult result;
            try {
              result = args->resumed ? train::train(args->config, *args->resumed, hooks, args->allow_non_finite,
                                                    device, group.get())
                                     : train::train(args->config, "", hooks, args->allow_non_finite, device, group.get());
            } catch (...) {
              restore();
              throw;
            }
            restore();
            if (main) print_summary(result, text);
            return result.interrupted ? 130 : 0;
          }};
}

}  // namespace convnn::cli
