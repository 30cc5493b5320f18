// The command line reads the library's tables: every enum flag of `convnn train` accepts exactly
// the library's names, --help shows the structs' defaults (no help text restates one), and the
// JSON config's keys are the flags.
#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "convnn/bench/bench.h"
#include "convnn/data/config.h"
#include "convnn/data/datasets.h"
#include "convnn/dist/process_group.h"
#include "convnn/config/train_config.h"
#include "convnn/verify/identities.h"
#include "data/fixtures.h"
#include "model_options.h"
#include "train_options.h"

namespace convnn::cli {
namespace {

// `convnn train` as main.cpp sets it up: defaults captured from the bound fields.
struct TrainCommand {
  CLI::App app{"convnn"};
  CLI::App* sub = nullptr;
  TrainArgs args;

  TrainCommand() {
    app.option_defaults()->always_capture_default();
    sub = app.add_subcommand("train");
    add_train_options(sub, args);
  }

  // Parses `convnn train <flags>`: CLI11's message, or "" when the flags parse.
  std::string parse(const std::string& flags) {
    try {
      app.parse("train " + flags, false);
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
    return "";
  }
};

// An enum flag, its library list, and the name of the field it sets.
struct EnumFlag {
  const char* flag;
  std::vector<std::string> names;
  std::function<std::string(const train::TrainConfig&)> field;
};

std::vector<EnumFlag> enum_flags() {
  using train::TrainConfig;
  return {
      {"--opt", train::optimizer_names(), [](const TrainConfig& c) { return to_string(c.optimization.optimizer); }},
      {"--decay-on", train::decay_on_names(), [](const TrainConfig& c) { return to_string(c.optimization.decay_on); }},
      {"--sched", train::schedule_names(), [](const TrainConfig& c) { return to_string(c.optimization.schedule); }},
      {"--precision", train::precision_names(),
       [](const TrainConfig& c) { return to_string(c.optimization.precision); }},
      {"--recipe", data::recipe_names(), [](const TrainConfig& c) { return data::to_string(*c.augmentation.recipe); }},
      {"--dataset", data::config_dataset_names(), [](const TrainConfig& c) { return c.data.dataset; }},
      {"--layer", models::resnet_layer_names(),
       [](const TrainConfig& c) { return std::string(to_string(c.model_config.resnet.layer)); }},
      {"--attention", models::vit_attention_names(),
       [](const TrainConfig& c) { return std::string(to_string(c.model_config.vit.attention)); }},
      {"--position-embedding", models::position_embedding_names(),
       [](const TrainConfig& c) { return std::string(to_string(*c.model_config.vit.position_embedding)); }},
      {"--similarity", similarity_names(),
       [](const TrainConfig& c) { return std::string(to_string(*c.model_config.convnn.similarity)); }},
      {"--rho", rho_names(), [](const TrainConfig& c) { return std::string(to_string(*c.model_config.convnn.rho)); }},
      {"--aggregation", nn::aggregation_names(),
       [](const TrainConfig& c) { return std::string(nn::to_string(*c.model_config.convnn.aggregation)); }},
  };
}

TEST(CliOptions, EveryEnumFlagAcceptsExactlyTheLibrarysNames) {
  for (const auto& e : enum_flags()) {
    ASSERT_FALSE(e.names.empty()) << e.flag;
    for (const auto& name : e.names) {
      TrainCommand command;
      EXPECT_EQ(command.parse(std::string(e.flag) + " " + name), "") << e.flag << " " << name;
      EXPECT_EQ(e.field(command.args.config), name) << e.flag;
    }
    TrainCommand command;
    const auto message = command.parse(std::string(e.flag) + " not-a-name");
    EXPECT_NE(message.find("not-a-name"), std::string::npos) << e.flag << ": " << message;
    // CLI11 lists the accepted set as {a,b,c}: exactly the library's names, in its order.
    std::string set;
    for (const auto& name : e.names) set += (set.empty() ? "{" : ",") + name;
    EXPECT_NE(message.find(set + "}"), std::string::npos) << e.flag << " does not offer " << set << "}: " << message;
  }
}

// A value as CLI11 prints a default, read back as numbers ("0.9 0.999": two).
std::vector<double> numbers_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<double> values;
  for (double v = 0; in >> v;) values.push_back(v);
  return values;
}

TEST(CliOptions, EveryJsonKeyIsAFlagAndHelpShowsItsDefault) {
  TrainCommand command;
  const nlohmann::json defaults = train::TrainConfig{};
  // Keys that are not flags of add_train_options, as train/config.h says.
  const std::vector<std::string> not_flags{"model_config", "world_size", "dist_backend", "sync_bn"};
  for (const auto& [key, value] : defaults.items()) {
    if (std::find(not_flags.begin(), not_flags.end(), key) != not_flags.end()) continue;
    auto flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    const auto* option = command.sub->get_option_no_throw(flag);
    ASSERT_NE(option, nullptr) << "JSON key " << key << " has no flag " << flag;
    if (value.is_boolean()) continue;  // a flag shows no value
    const auto shown = option->get_default_str();
    if (value.is_null()) {
      EXPECT_EQ(shown, "") << flag << ": unset, its help says what it becomes";
    } else if (value.is_string()) {
      EXPECT_EQ(shown, value.get<std::string>()) << flag;
    } else {
      const auto expected = value.is_array() ? value.get<std::vector<double>>() : std::vector<double>{value.get<double>()};
      const auto got = numbers_of(shown);
      ASSERT_EQ(got.size(), expected.size()) << flag << " shows '" << shown << "'";
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], expected[i], 1e-5 * std::abs(expected[i])) << flag << " shows '" << shown << "'";
      }
    }
  }
  for (const auto& [key, value] : defaults.at("model_config").items()) {
    auto flag = "--" + key;
    std::replace(flag.begin(), flag.end(), '_', '-');
    // num_classes and in_channels are the data set's (image_size: the data flag, checked above).
    if (key == "num_classes" || key == "in_channels") continue;
    EXPECT_NE(command.sub->get_option_no_throw(flag), nullptr) << "model_config key " << key << " has no flag";
  }
}

TEST(CliOptions, AConfigFileGivesTheCommandsPresentationAndFlagsOverrideIt) {
  // quiet, plots and log_interval are the command's, not the run's config: the command takes them
  // out of a --config file before the library reads the rest, and checks them itself.
  testing::TempDir dir;
  const auto config_file = [&](const std::string& name, const std::string& text) {
    const auto path = dir.file(name);
    testing::write_file(path, testing::Bytes(text.begin(), text.end()));
    return path;
  };
  {
    TrainCommand command;
    const auto path = config_file("a.json", R"({"quiet": true, "plots": false, "log_interval": 7, "epochs": 3})");
    ASSERT_EQ(command.parse("--config " + path), "");
    EXPECT_TRUE(command.args.presentation.quiet);
    EXPECT_FALSE(command.args.presentation.plots);
    EXPECT_EQ(command.args.presentation.log_interval, 7);
    EXPECT_EQ(command.args.config.optimization.epochs, 3);
  }
  {
    TrainCommand command;
    const auto path = config_file("b.json", R"({"log_interval": 7})");
    ASSERT_EQ(command.parse("--config " + path + " --log-interval 9"), "");
    EXPECT_EQ(command.args.presentation.log_interval, 9);
  }
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"({"quiet": "yes"})", "quiet must be true or false, got \"yes\""},
           {R"({"log_interval": 0})", "log_interval must be an integer of at least 1, got 0"}}) {
    TrainCommand command;
    const auto path = config_file("c.json", text);
    const auto message = testing::error_of([&] { command.parse("--config " + path); });
    EXPECT_NE(message.find("config file '" + path + "': " + expected), std::string::npos) << message;
  }
  TrainCommand command;
  EXPECT_NE(command.parse("--log-interval 0"), "");
}

TEST(CliOptions, NoHelpTextRestatesADefault) {
  TrainCommand command;
  for (const auto* option : command.sub->get_options()) {
    const auto& text = option->get_description();
    EXPECT_EQ(text.find("(default"), std::string::npos) << option->get_name() << ": " << text;
  }
  const auto help = command.sub->help();
  for (const char* shown : {"=adamw", "=cosine", "=float32", "=0.001", "=0.9 0.999", "=resnet18", "=conv"}) {
    EXPECT_NE(help.find(shown), std::string::npos) << "--help lacks " << shown << ":\n" << help;
  }
}

// Each table's names parse to the value that prints back as that name, in table order, and an
// unknown name is refused naming the choices.
template <typename Parse, typename Print>
void expect_round_trip(const std::vector<std::string>& names, Parse parse, Print print) {
  ASSERT_FALSE(names.empty());
  for (const auto& name : names) EXPECT_EQ(std::string(print(parse(name))), name);
  const auto message = testing::error_of([&] { parse("not-a-name"); });
  EXPECT_NE(message.find("not-a-name"), std::string::npos) << message;
  for (const auto& name : names) EXPECT_NE(message.find(name), std::string::npos) << message;
}

TEST(CliOptions, EveryNameTableParsesAndPrintsBack) {
  const auto as_text = [](const auto& v) { return to_string(v); };
  expect_round_trip(train::optimizer_names(), train::parse_optimizer, as_text);
  expect_round_trip(train::decay_on_names(), train::parse_decay_on, as_text);
  expect_round_trip(train::schedule_names(), train::parse_schedule, as_text);
  expect_round_trip(train::precision_names(), train::parse_precision, as_text);
  expect_round_trip(data::recipe_names(), data::parse_recipe, as_text);
  expect_round_trip(data::split_names(), data::parse_split, as_text);
  expect_round_trip(models::resnet_layer_names(), models::parse_resnet_layer, as_text);
  expect_round_trip(models::vit_attention_names(), models::parse_vit_attention, as_text);
  expect_round_trip(models::position_embedding_names(), models::parse_position_embedding, as_text);
  expect_round_trip(nn::slot_order_names(), nn::parse_slot_order, as_text);
  expect_round_trip(nn::aggregation_names(), nn::parse_aggregation, as_text);
  expect_round_trip(nn::eval_candidates_names(), nn::parse_eval_candidates, as_text);
  expect_round_trip(nn::kernel_init_names(), nn::parse_kernel_init, as_text);
  expect_round_trip(nn::projection_names(), nn::parse_projection, as_text);
  expect_round_trip(bench::level_names(), bench::parse_level, as_text);
  expect_round_trip(bench::impl_names(), bench::parse_impl, as_text);
  expect_round_trip(bench::dtype_names(), bench::parse_dtype, bench::dtype_name);
  expect_round_trip(verify::dtype_names(), verify::parse_dtype, bench::dtype_name);
  // The names the bench measures are the library's, in its order.
  for (const auto& name : bench::similarity_names()) {
    EXPECT_NE(std::find(similarity_names().begin(), similarity_names().end(), name), similarity_names().end());
  }
  std::vector<std::string> phases;
  for (const auto phase : bench::kPhases) phases.emplace_back(bench::to_string(phase));
  EXPECT_EQ(phases, bench::phase_names());
  // A backend on the CPU: gloo (nccl needs a CUDA device); auto is the command line's addition.
  const c10::Device cpu(c10::kCPU);
  EXPECT_EQ(dist::to_string(dist::parse_backend("gloo", cpu, "--dist-backend")), "gloo");
  EXPECT_EQ(dist::to_string(dist::parse_backend("auto", cpu, "--dist-backend")), "gloo");
  EXPECT_EQ(dist::to_string(dist::Backend::Nccl), dist::backend_names().back());
  const auto message = testing::error_of([&] { dist::parse_backend("mpi", cpu, "--dist-backend"); });
  EXPECT_NE(message.find("--dist-backend must be auto or one of gloo, nccl, got 'mpi'"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace convnn::cli

namespace convnn::cli {
namespace {

// The integer and seed checks: a signed or unsigned integer text in range passes ("+3" too, which
// std::from_chars alone refuses), one outside says its rule, a non-integer is left to CLI11's
// conversion error (the check passes it).
TEST(CliOptions, IntegerAndSeedChecksSayTheirRuleInTheUsersText) {
  const auto check = [](const CLI::Validator& validator, std::string text) { return validator(text); };
  const auto at_least_1 = integer_at_least(1);
  EXPECT_EQ(check(at_least_1, "1"), "");
  EXPECT_EQ(check(at_least_1, "+3"), "");
  EXPECT_EQ(check(at_least_1, "0"), "must be an integer of at least 1, got 0");
  EXPECT_EQ(check(at_least_1, "-99999999999999999999"), "must be an integer of at least 1, got -99999999999999999999");
  EXPECT_EQ(check(at_least_1, "3x"), "");
  EXPECT_EQ(check(at_least_1, "1.5"), "");
  EXPECT_EQ(at_least_1.get_description(), "POSITIVE");
  EXPECT_EQ(integer_at_least(0).get_description(), "NONNEGATIVE");
  const auto seed = seed_value();
  EXPECT_EQ(check(seed, "0"), "");
  EXPECT_EQ(check(seed, "9223372036854775807"), "");
  EXPECT_EQ(check(seed, "9223372036854775808"), "must be an integer in [0, 2^63), got 9223372036854775808");
  EXPECT_EQ(check(seed, "-1"), "must be an integer in [0, 2^63), got -1");
}

}  // namespace
}  // namespace convnn::cli
