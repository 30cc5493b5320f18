// `convnn info`: a registry model's parameters, MACs, FLOPs and comparisons, per stage (and per
// operation with --layers), as a table or as JSON. The counting rules are docs/flops.md.
// `convnn info --list`: the registry's rows (name, family, preset).
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "convnn/models/registry.h"
#include "model_options.h"

namespace convnn::cli {
namespace {

struct InfoArgs {
  std::string model;
  models::ModelConfig config;
  bool json = false;
  bool layers = false;
  bool list = false;
};

// 25557032 -> "25,557,032"
std::string grouped(int64_t value) {
  auto digits = std::to_string(value < 0 ? -value : value);
  for (auto i = static_cast<int64_t>(digits.size()) - 3; i > 0; i -= 3)
    digits.insert(static_cast<size_t>(i), ",");
  return value < 0 ? "-" + digits : digits;
}

// 4089184256 -> "4.09 G"
std::string scaled(int64_t value) {
  const double v = static_cast<double>(value);
  if (v >= 1e9) return fmt::format("{:.2f} G", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f} M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f} K", v / 1e3);
  return std::to_string(value);
}

// The options that shape the model, with the family defaults filled in.
std::string describe(const std::string& name, const models::ModelConfig& c) {
  using models::to_string;
  using nn::to_string;
  const auto candidates = [](int64_t r) { return r > 0 ? std::to_string(r) : std::string("all"); };
  if (models::model_entry(name).family == models::ModelFamily::ResNet) {
    const auto o = models::resnet_options(name, c);
    const auto& slots = o.slots();
    auto text = fmt::format("layer={}", to_string(slots.layer()));
    if (slots.layer() != models::ResNetLayer::Conv) {
      const auto& n = slots.convnn();
      text += fmt::format(" k={} candidates={} similarity={} rho={} aggregation={} padding={}", n.k(),
                          candidates(n.num_candidates()), convnn::to_string(n.similarity()),
                          to_string(n.rho()), to_string(n.aggregation()), n.padding());
    }
    if (slots.layer() == models::ResNetLayer::Branching) text += fmt::format(" lambda={}", slots.lambda());
    if (slots.strided_slots()) text += " strided_slots";
    return text + fmt::format(" width={} stem={}", o.width(), o.small_stem() ? "small" : "imagenet");
  }
  const auto attention_text = [&](models::ViTAttention attention, const nn::ConvNNAttentionOptions& a) {
    auto text = fmt::format("attention={}", to_string(attention));
    if (attention == models::ViTAttention::MHSA) return text;
    return text + fmt::format(" k={} candidates={} similarity={} rho={} aggregation={}", a.k(),
                              candidates(a.num_candidates()), convnn::to_string(a.similarity()), to_string(a.rho()),
                              to_string(a.aggregation()));
  };
  if (models::model_entry(name).family == models::ModelFamily::LanguageModel) {
    const auto o = models::language_model_options(name, c);
    return fmt::format("width={} depth={} heads={} kv_heads={} context={} {} position={}", o.embed_dim(), o.depth(),
                       o.num_heads(), o.num_kv_heads() > 0 ? o.num_kv_heads() : o.num_heads(), o.context(),
                       attention_text(o.attention(), o.convnn()), to_string(o.position_embedding()));
  }
  const auto o = models::vit_options(name, c);
  auto text = fmt::format("width={} depth={} heads={} patch={} {}", o.embed_dim(), o.depth(), o.num_heads(),
                          o.patch_size(), attention_text(o.attention(), o.convnn()));
  return text + fmt::format(" position={}{}", to_string(o.position_embedding()), c.vit.paper ? " paper" : "");
}

nlohmann::json cost_json(const models::Cost& cost) {
  return {{"macs", cost.macs},
          {"flops", cost.flops()},
          {"other_flops", cost.other_flops},
          {"comparisons", cost.comparisons}};
}

void print_json(const models::Model& model, const models::CostReport& report) {
  nlohmann::json out{{"model", model.name()},
                     {"config", model.config()},
                     {"description", describe(model.name(), model.config())},
                     {"parameters", model.parameter_count()}};
  out.update(cost_json(report.total()));
  out["stages"] = nlohmann::json::array();
  for (const auto& s : report.stages()) {
    auto stage = cost_json(s.cost);
    stage["stage"] = s.stage;
    stage["parameters"] = s.parameters;
    out["stages"].push_back(stage);
  }
  out["layers"] = nlohmann::json::array();
  for (const auto& e : report.entries()) {
    auto entry = cost_json(e.cost);
    entry["stage"] = e.stage;
    entry["layer"] = e.layer;
    entry["op"] = e.op;
    out["layers"].push_back(entry);
  }
  std::cout << out.dump(2) << "\n";
}

void print_table(const models::Model& model, const models::CostReport& report, bool layers) {
  const auto& c = model.config();
  const auto total = report.total();
  std::cout << fmt::format("model        {}  {}\n", model.name(), describe(model.name(), c));
  if (models::model_entry(model.name()).family == models::ModelFamily::LanguageModel) {
    std::cout << fmt::format("input        {} tokens (the context), a vocabulary of {}\n",
                             models::language_model_options(model.name(), c).context(), c.num_classes.value());
  } else {
    std::cout << fmt::format("input        {} x {} x {}, {} classes\n", c.in_channels, c.image_size,
                             c.image_size, c.num_classes.value());
  }
  std::cout << fmt::format("parameters   {}\n", grouped(model.parameter_count()));
  std::cout << fmt::format("MACs         {:<10} ({})\n", scaled(total.macs), grouped(total.macs));
  std::cout << fmt::format("FLOPs        {:<10} (2 x MACs + {} other FLOPs)\n", scaled(total.flops()),
                           scaled(total.other_flops));
  std::cout << fmt::format("comparisons  {:<10} (top-k, max-pool, ReLU, softmax max; not FLOPs)\n\n",
                           scaled(total.comparisons));

  const auto header = fmt::format("{:<12} {:>12} {:>11} {:>11} {:>11}", "stage", "parameters", "MACs",
                                  "FLOPs", "comparisons");
  std::cout << header << "\n" << std::string(header.size(), '-') << "\n";
  for (const auto& s : report.stages()) {
    std::cout << fmt::format("{:<12} {:>12} {:>11} {:>11} {:>11}\n", s.stage, grouped(s.parameters),
                             scaled(s.cost.macs), scaled(s.cost.flops()), scaled(s.cost.comparisons));
  }
  std::cout << std::string(header.size(), '-') << "\n"
            << fmt::format("{:<12} {:>12} {:>11} {:>11} {:>11}\n", "total", grouped(model.parameter_count()),
                           scaled(total.macs), scaled(total.flops()), scaled(total.comparisons));
  if (!layers) return;
  std::cout << "\n";
  size_t width = 5;
  for (const auto& e : report.entries()) width = std::max(width, e.layer.size());
  const auto layer_header =
      fmt::format("{:<{}} {:<12} {:>11} {:>11} {:>11}", "layer", width, "op", "MACs", "FLOPs", "comparisons");
  std::cout << layer_header << "\n" << std::string(layer_header.size(), '-') << "\n";
  for (const auto& e : report.entries()) {
    std::cout << fmt::format("{:<{}} {:<12} {:>11} {:>11} {:>11}\n", e.layer, width, e.op,
                             scaled(e.cost.macs), scaled(e.cost.flops()), scaled(e.cost.comparisons));
  }
}

// One line a model: name, family and the sizes its name stands for; or the rows as JSON.
void print_list(bool json) {
  const auto& entries = models::model_entries();
  if (json) {
    std::cout << nlohmann::json(entries).dump(2) << "\n";
    return;
  }
  for (const auto& entry : entries) {
    const nlohmann::json row = entry;
    std::string preset;
    for (const auto& item : row.at("preset").items())
      preset += fmt::format("{}{}={}", preset.empty() ? "" : " ", item.key(), item.value().dump());
    std::cout << fmt::format("{:<12} {:<7} {}\n", entry.name, models::to_string(entry.family), preset);
  }
}

int run_info(const InfoArgs& args) {
  if (args.list) {
    print_list(args.json);
    return 0;
  }
  TORCH_CHECK(!args.model.empty(), "info: --model is required (convnn info --list names the models)");
  const auto model = models::build_model(args.model, args.config);
  const auto report = model.cost();
  if (args.json) {
    print_json(model, report);
  } else {
    print_table(model, report, args.layers);
  }
  return 0;
}

}  // namespace

Command add_info_command(CLI::App& app) {
  auto args = std::make_shared<InfoArgs>();
  auto* sub = app.add_subcommand("info",
                                 "Parameters, MACs, FLOPs and comparisons of a model, per stage "
                                 "(counting rules: docs/flops.md)");
  add_model_options(sub, args->model, args->config);
  sub->get_option("--model")->required(false);
  sub->add_flag("--list", args->list, "List the registry's models (name, family, preset); with --json as JSON")
      ->excludes("--model");
  sub->add_flag("--json", args->json, "Print everything, per operation included, as JSON");
  sub->add_flag("--layers", args->layers, "Also list every operation of every layer");
  return {sub, [args] { return run_info(*args); }};
}

}  // namespace convnn::cli
