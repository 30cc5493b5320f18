#pragma once
// The model options of the `convnn` subcommands that build a model from the registry (info, and
// the training command), declared once so that every subcommand spells them alike.
#include <CLI/CLI.hpp>
#include <string>

#include "convnn/models/registry.h"

namespace convnn::cli {

/// Registers --model (required) and one flag per ModelConfig field on `sub`; parsing fills
/// `name` and `config`.
void add_model_options(CLI::App* sub, std::string& name, models::ModelConfig& config);

}  // namespace convnn::cli
