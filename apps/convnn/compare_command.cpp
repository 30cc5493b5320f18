// `convnn compare`: trains a grid of models under one fixed budget (same data subset, epochs and
// recipe for every cell) and writes a results table (markdown and JSON) with accuracy over seeds,
// parameters, MACs and time per epoch:
//   ResNet: conv vs ConvNN-only vs branching (lambda 0.5), for each K, all vs random candidates;
//   ViT:    MHSA vs KVT vs ConvNN attention at matched K.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "convnn/checkpoint/checkpoint.h"
#include "convnn/train/trainer.h"
#include "convnn/util/device.h"
#include "model_options.h"
#include "sinks.h"
#include "train_options.h"

namespace convnn::cli {
namespace {

namespace fs = std::filesystem;

// The families the grid has cells for: the image classifiers of the family table (the language
// models train on text: scripts/lm-results.sh compares them).
const std::vector<std::string>& image_families() {
  static const std::vector<std::string> families = [] {
    std::vector<std::string> names;
    for (const auto& row : models::model_families()) {
      if (row.image_classifier) names.emplace_back(row.name);
    }
    return names;
  }();
  return families;
}

struct CompareArgs {
  TrainArgs base;
  std::vector<int64_t> seeds{0};
  std::vector<int64_t> ks{4, 9, 16};
  int64_t random_candidates = 32;
  std::vector<std::string> families = image_families();
  std::string vit_model = "vit_tiny";
  int64_t vit_patch = 4, vit_depth = 4, vit_embed_dim = 96, vit_heads = 3;
  bool dry_run = false;
};

struct Cell {
  std::string family, layer, candidates;  // layer: conv / convnn / branching / mhsa / kvt
  int64_t k = 0;                           // 0: not a ConvNN cell
  train::TrainConfig config;
};

std::string cell_name(const Cell& c) {
  std::string name = c.family + "-" + c.layer;
  if (c.k > 0) name += fmt::format("-k{}", c.k);
  if (!c.candidates.empty()) name += "-" + c.candidates;
  return name;
}

// A family's starting config: the training options', and for the ViTs the preset and sizes of the
// --vit-* options.
train::TrainConfig family_base(const CompareArgs& a, const models::ModelFamilyRow& row) {
  train::TrainConfig base = a.base.config;
  if (row.family != models::ModelFamily::ViT) return base;
  base.model = a.vit_model;
  base.model_config = models::ModelConfig{};
  base.model_config.vit.patch_size = a.vit_patch;
  base.model_config.vit.depth = a.vit_depth;
  base.model_config.vit.embed_dim = a.vit_embed_dim;
  base.model_config.vit.num_heads = a.vit_heads;
  return base;
}

// `config` with options set by name, through the flat JSON that names them (the family row's
// names: its layer option, its ConvNN-only options).
models::ModelConfig with_options(const models::ModelConfig& config, const nlohmann::json& options) {
  nlohmann::json json = config;
  json.update(options);
  return json.get<models::ModelConfig>();
}

// Per image family: its layer without ConvNN, then each ConvNN layer at every K, on all candidates
// and, where the family's row asks for it, on random ones.
std::vector<Cell> grid(const CompareArgs& a) {
  std::vector<Cell> cells;
  for (const auto& row : models::model_families()) {
    if (!row.image_classifier ||
        std::find(a.families.begin(), a.families.end(), row.name) == a.families.end()) {
      continue;
    }
    const auto base = family_base(a, row);
    Cell baseline{row.name, row.baseline_layer, "", 0, base};
    // The baseline uses none of ConvNN's options: the grid's values of them would be refused.
    nlohmann::json baseline_options = {{row.layer_option, row.baseline_layer}};
    const nlohmann::json defaults = models::ModelConfig{};
    for (const auto& [option, what] : row.convnn_only_options) baseline_options[option] = defaults.at(option);
    baseline.config.model_config = with_options(base.model_config, baseline_options);
    baseline.config.model_config.convnn = models::ConvNNConfig{};
    cells.push_back(baseline);
    const std::vector<bool> random_candidates =
        row.compare_random_candidates ? std::vector<bool>{false, true} : std::vector<bool>{false};
    for (const auto& layer : row.convnn_layers) {
      for (const int64_t k : a.ks) {
        for (const bool random : random_candidates) {
          const auto candidates = !row.compare_random_candidates ? ""
                                  : random                       ? fmt::format("r{}", a.random_candidates)
                                                                 : "all";
          Cell cell{row.name, layer, candidates, k, base};
          cell.config.model_config = with_options(base.model_config, {{row.layer_option, layer}});
          cell.config.model_config.convnn.k = k;
          cell.config.model_config.convnn.num_candidates = random ? a.random_candidates : 0;
          cells.push_back(cell);
        }
      }
    }
  }
  return cells;
}

struct CellResult {
  Cell cell;
  std::vector<double> top1, top5, seconds_per_epoch;
  int64_t parameters = 0, macs = 0;
};

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / v.size();
}

double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / (v.size() - 1));
}

std::string markdown(const std::vector<CellResult>& results, const CompareArgs& a, const std::string& command) {
  std::ostringstream md;
  const auto& c = a.base.config;
  md << "| model | layer / attention | K | candidates | top-1 % (mean ± sd) | top-1 per seed | top-5 % | "
        "parameters | MMACs / image | s / epoch |\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    std::string seeds;
    for (double t : r.top1) seeds += (seeds.empty() ? "" : ", ") + fmt::format("{:.2f}", t);
    md << fmt::format("| {} | {} | {} | {} | {:.2f} ± {:.2f} | {} | {:.2f} | {:L} | {:.1f} | {:.1f} |\n",
                      r.cell.config.model, r.cell.layer, r.cell.k > 0 ? std::to_string(r.cell.k) : "–",
                      r.cell.candidates.empty() ? "all" : r.cell.candidates, mean(r.top1), stddev(r.top1),
                      seeds, mean(r.top5), r.parameters, r.macs / 1e6, mean(r.seconds_per_epoch));
  }
  md << fmt::format(
      "\nData: {} ({} training images{}, {} test images{}); {} epochs, batch {}, {} lr {}, "
      "warm-up {} epochs, seeds {}.\nCommand: `{}`\n",
      c.data.dataset, c.data.train_subset ? std::to_string(c.data.train_subset) : "all",
      c.data.train_subset ? " of a seeded shuffle" : "",
      c.data.val_subset ? std::to_string(c.data.val_subset) : "all",
      c.data.val_subset ? " of a seeded shuffle" : "", c.optimization.epochs, c.optimization.batch_size,
      train::to_string(c.optimization.optimizer), c.optimization.lr, c.optimization.warmup_epochs,
      fmt::format("{}", fmt::join(a.seeds, ", ")), command);
  return md.str();
}

nlohmann::json to_json(const std::vector<CellResult>& results, const CompareArgs& a, const std::string& command) {
  auto rows = nlohmann::json::array();
  for (const auto& r : results) {
    rows.push_back({{"name", cell_name(r.cell)}, {"model", r.cell.config.model}, {"layer", r.cell.layer},
                    {"k", r.cell.k}, {"candidates", r.cell.candidates.empty() ? "all" : r.cell.candidates},
                    {"top1", r.top1}, {"top1_mean", mean(r.top1)}, {"top1_sd", stddev(r.top1)},
                    {"top5", r.top5}, {"parameters", r.parameters}, {"macs", r.macs},
                    {"seconds_per_epoch", r.seconds_per_epoch}, {"config", r.cell.config}});
  }
  return {{"command", command}, {"seeds", a.seeds}, {"cells", rows}};
}

int run_compare(CompareArgs& a, const std::string& command) {
  const auto device = resolve_device(a.base.device, "--device");
  auto& base = a.base.config;
  const auto root =
      fs::path(base.run.output) / (base.run.experiment.empty() ? "compare" : base.run.experiment);
  const auto cells = grid(a);
  // A bad cell fails now rather than after the cells before it have trained.
  for (const auto& cell : cells) train::validate(cell.config);
  if (a.dry_run) {
    fmt::print("{} cells x {} seeds:\n", cells.size(), a.seeds.size());
    for (const auto& cell : cells) fmt::print("  {} ({})\n", cell_name(cell), cell.config.model);
    return 0;
  }
  fs::create_directories(root);
  std::vector<CellResult> results;
  fmt::print("{} cells x {} seeds into {} on {}\n", cells.size(), a.seeds.size(), root.string(),
             device_name(device));
  for (const auto& cell : cells) {
    CellResult result{cell};
    for (const int64_t seed : a.seeds) {
      auto config = cell.config;
      config.run.seed = static_cast<uint64_t>(seed);
      config.run.output = root.string();
      config.run.experiment = fmt::format("{}-seed{}", cell_name(cell), seed);
      const auto run_dir = root / config.run.experiment;
      // A finished cell is reused and an unfinished one resumed, so an interrupted comparison
      // continues where it stopped.
      const auto latest = checkpoint::latest_checkpoint_path(run_dir.string());
      const bool started = fs::exists(latest);
      const bool finished =
          started && checkpoint::read_checkpoint_header(latest).position.epoch >= config.optimization.epochs;
      train::TrainResult r;
      if (finished) {
        fmt::print("  {} seed {}: reusing {}\n", cell_name(cell), seed, run_dir.string());
        const train::MetricsLog log(run_dir.string(), config.optimization.epochs + 1);
        r.epochs = log.epochs();
        auto model = models::build_model(config.model, checkpoint::read_checkpoint_header(latest).config.model_config);
        r.parameters = model.parameter_count();
        r.macs = model.cost().total().macs;
        r.final_eval.top1 = r.epochs.back().val_top1;
        r.final_eval.top5 = r.epochs.back().val_top5;
      } else {
        ConsoleSink console(/*quiet=*/true, a.base.presentation.log_interval);  // no plots either
        train::TrainHooks hooks;
        hooks.sinks.push_back(&console);
        r = train::train(config, started ? latest : "", hooks, /*allow_non_finite=*/false, device);
      }
      std::vector<double> times;
      for (const auto& e : r.epochs) times.push_back(e.epoch_time_s);
      result.top1.push_back(r.final_eval.top1);
      result.top5.push_back(r.final_eval.top5);
      result.seconds_per_epoch.push_back(mean(times));
      result.parameters = r.parameters;
      result.macs = r.macs;
      fmt::print("  {} seed {}: top-1 {:.2f}%  {:.1f} s/epoch\n", cell_name(cell), seed, r.final_eval.top1,
                 mean(times));
      std::fflush(stdout);
    }
    results.push_back(result);
  }
  const auto md = markdown(results, a, command);
  checkpoint::write_file_atomically((root / "results.md").string(), md);
  checkpoint::write_file_atomically((root / "results.json").string(), to_json(results, a, command).dump(2) + "\n");
  fmt::print("\n{}\nwritten: {}/results.md, results.json\n", md, root.string());
  return 0;
}

}  // namespace

Command add_compare_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "compare", "Train conv / ConvNN / branching ResNets and MHSA / KVT / ConvNN-attention ViTs under one "
                 "budget and tabulate accuracy, parameters, MACs and time");
  auto args = std::make_shared<CompareArgs>();
  add_train_options(sub, args->base);
  // The cells are different models: no one set of weights starts them all.
  sub->remove_option(sub->get_option("--initial-checkpoint"));
  sub->add_option("--seeds", args->seeds, "Seeds of every cell")
      ->delimiter(',')
      ->check(explicit_value(fmt::format("seed {}", args->seeds.front()), /*allow_zero=*/true))
      ->group("Compare");
  sub->add_option("--ks", args->ks, "ConvNN K values")->delimiter(',')->group("Compare");
  // 0 in the model config means "all candidates" or "the preset's value": given here it would
  // silently turn a cell into another one.
  sub->add_option("--random-candidates", args->random_candidates, "r of the random-candidate cells")
      ->check(explicit_value(std::to_string(args->random_candidates)))
      ->group("Compare");
  sub->add_option("--families", args->families, "Model families to compare (comma-separated)")
      ->delimiter(',')->check(CLI::IsMember(image_families()))->group("Compare");
  sub->add_flag("--dry-run", args->dry_run, "List the cells (checked) and train none")->group("Compare");
  sub->add_option("--vit-model", args->vit_model, "ViT preset of the attention cells")
      ->check(CLI::IsMember(models::model_names(models::ModelFamily::ViT)))
      ->group("Compare");
  sub->add_option("--vit-patch", args->vit_patch, "ViT patch size")
      ->check(explicit_value(std::to_string(args->vit_patch)))
      ->group("Compare");
  sub->add_option("--vit-depth", args->vit_depth, "ViT blocks")
      ->check(explicit_value(std::to_string(args->vit_depth)))
      ->group("Compare");
  sub->add_option("--vit-embed-dim", args->vit_embed_dim, "ViT width")
      ->check(explicit_value(std::to_string(args->vit_embed_dim)))
      ->group("Compare");
  sub->add_option("--vit-heads", args->vit_heads, "ViT heads")
      ->check(explicit_value(std::to_string(args->vit_heads)))
      ->group("Compare");
  return {sub, [args] { return run_compare(*args, command_line()); }};
}

}  // namespace convnn::cli
