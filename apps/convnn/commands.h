#pragma once
// Subcommands of the `convnn` program. Each add_*_command registers its options on a subcommand
// of `app` and returns the function that runs it (after parsing and thread set-up) and returns
// the process exit code.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace convnn::cli {

struct Command {
  CLI::App* subcommand = nullptr;
  std::function<int()> run;
};

/// The command line of this process, as typed (for reports that must say how they were made).
const std::string& command_line();
/// The same, word by word (argv, the program's name first).
const std::vector<std::string>& command_arguments();

Command add_verify_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_info_command(CLI::App& app);
Command add_train_command(CLI::App& app);
Command add_eval_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_compare_command(CLI::App& app);
Command add_checkpoint_command(CLI::App& app);
Command add_viz_command(CLI::App& app);

}  // namespace convnn::cli
