#pragma once
// The model options of the `convnn` subcommands that build a model from the registry (info, and
// the training command), declared once so that every subcommand spells them alike, and the check
// that every option with a "leave it out" default shares.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "convnn/models/registry.h"

namespace convnn::cli {

/// An option given by name (of an enum field, or of an optional one): CLI11 checks the name
/// against `names` (the library's list of the enum, e.g. nn::aggregation_names()), `parse` turns
/// it into the value. An enum field shows its struct default in --help, as CLI11 shows a bound
/// field's; an optional one shows none (unset: the help says what it becomes).
template <typename Target, typename Parse>
CLI::Option* add_enum_option(CLI::App* sub, const std::string& flag, Target& target, Parse parse,
                             std::vector<std::string> names, const std::string& help) {
  auto* option = sub->add_option_function<std::string>(
                        flag, [&target, parse](const std::string& s) { target = parse(s); }, help)
                     ->check(CLI::IsMember(std::move(names)));
  if constexpr (std::is_enum_v<Target>) {
    option->default_function([&target] { return std::string(to_string(target)); })->capture_default_str();
  }
  return option;
}

/// For options whose 0 (or -1) stands for a default: accepts only positive numbers
/// (`allow_zero`: non-negative ones), since a default is chosen by leaving the flag out and an
/// explicit sentinel would otherwise be replaced silently. `left_out` says what leaving it out
/// gives, for the message. A value that is not a number passes on to CLI11's conversion error.
CLI::Validator explicit_value(const std::string& left_out, bool allow_zero = false);

/// An integer option of at least `minimum`, its message in the user's own text ("must be an
/// integer of at least 1, got 0"): CLI11's PositiveNumber and NonNegativeNumber print their bounds as
/// doubles (up to 1.8e308, in full). A value that is not an integer passes on to CLI11's conversion
/// error.
CLI::Validator integer_at_least(int64_t minimum);

/// A seed option: an integer in [0, 2^63) (the run config's rule, and what a JSON reader keeps
/// exactly). Bound to an unsigned field, CLI11 took "-1" as 2^64 - 1 and a value past 2^64 as
/// 2^64 - 1: `generate` sampled with it silently (every such seed the same text), `train`'s config
/// check named 18446744073709551615, a number the user never typed.
CLI::Validator seed_value();

/// Registers --model (required) and one flag per ModelConfig field on `sub`; parsing fills
/// `name` and `config`.
void add_model_options(CLI::App* sub, std::string& name, models::ModelConfig& config);

}  // namespace convnn::cli
