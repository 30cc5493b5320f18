// The `convnn` command: thin subcommands over libconvnn.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"

namespace {

// --threads wins over CONVNN_NUM_THREADS, which wins over all cores.
int thread_count(int flag) {
  if (flag > 0) return flag;
  if (const char* env = std::getenv("CONVNN_NUM_THREADS"); env && *env) {
    const std::string text(env);
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TORCH_CHECK(used == text.size() && value >= 1,
                "CONVNN_NUM_THREADS must be a positive integer, got '", text, "'");
    return value;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string typed_command_line;

}  // namespace

const std::string& convnn::cli::command_line() { return typed_command_line; }

int main(int argc, char** argv) {
  typed_command_line = "convnn";
  for (int i = 1; i < argc; ++i) typed_command_line += std::string(" ") + argv[i];
  CLI::App app{"convnn: Convolutional Nearest Neighbors on LibTorch"};
  app.require_subcommand(1);
  int threads = 0;
  app.add_option("--threads", threads,
                 "CPU threads for intra-op parallelism (default: CONVNN_NUM_THREADS, else all cores)")
      ->check(CLI::PositiveNumber);
  const std::vector<convnn::cli::Command> commands{
      convnn::cli::add_train_command(app),
      convnn::cli::add_eval_command(app),
      convnn::cli::add_compare_command(app),
      convnn::cli::add_verify_command(app),
      convnn::cli::add_bench_command(app),
      convnn::cli::add_info_command(app),
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    at::set_num_threads(thread_count(threads));
    for (const auto& command : commands) {
      if (command.subcommand->parsed()) return command.run();
    }
  } catch (const c10::Error& e) {
    std::cerr << "convnn: error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "convnn: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
