// The `convnn` command: thin subcommands over libconvnn.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "model_options.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace {

// A positive integer environment variable, or 0 when it is unset or empty.
int positive_variable(const char* name) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return 0;
  const std::string text(env);
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  TORCH_CHECK(used == text.size() && value >= 1, name, " must be a positive integer, got '", text, "'");
  return value;
}

// --threads wins over CONVNN_NUM_THREADS, which wins over all cores, shared among the processes
// torchrun starts on this machine (LOCAL_WORLD_SIZE) so that they do not oversubscribe it.
int thread_count(int flag) {
  if (flag > 0) return flag;
  if (const int value = positive_variable("CONVNN_NUM_THREADS")) return value;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int processes = std::max(1, positive_variable("LOCAL_WORLD_SIZE"));
  return std::max(1, cores / processes);
}

// glibc gives a freed block above its mmap threshold back to the system at once, so each step of a
// training or benchmark loop faults the pages of its large tensors in again: measured on a 2-core
// VM (AMD EPYC Zen 5), one ConvNN attention backward at the paper's Table 1 shape took 16 or 35 ms
// depending on how the heap happened to grow. Keeping blocks up to 32 MiB (glibc's largest mmap
// threshold) in the heap, untrimmed, is glibc's own form of the caching allocator that PyTorch's
// CPU performance guide advises (jemalloc, tcmalloc). A user's own MALLOC_MMAP_THRESHOLD_,
// MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES stand.
void keep_freed_memory() {
#if defined(__GLIBC__)
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(name) != nullptr) return;
  }
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
}

std::string typed_command_line;
std::vector<std::string> typed_arguments;

// An error is one line on a terminal and one record in a log, whatever the message holds.
std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  return text;
}

bool verbose_errors = false;

// convnn's own messages are one line that names the option, the value and the rule. What follows
// a first line comes from a library underneath (c10d appends its C++ backtrace to a peer's
// error): it is shown with --verbose only.
int report_error(const std::string& message) {
  const auto end = message.find('\n');
  const bool more = end != std::string::npos && message.find_first_not_of(" \n", end) != std::string::npos;
  if (verbose_errors || !more) {
    std::cerr << "convnn: error: " << (verbose_errors ? message : one_line(message)) << "\n";
  } else {
    std::cerr << "convnn: error: " << one_line(message.substr(0, end)) << " (details: --verbose)\n";
  }
  return 1;
}

}  // namespace

const std::string& convnn::cli::command_line() { return typed_command_line; }
const std::vector<std::string>& convnn::cli::command_arguments() { return typed_arguments; }

int main(int argc, char** argv) {
  keep_freed_memory();
  typed_arguments.assign(argv, argv + argc);
  typed_command_line = "convnn";
  for (int i = 1; i < argc; ++i) typed_command_line += std::string(" ") + argv[i];
  CLI::App app{"convnn: Convolutional Nearest Neighbors on LibTorch"};
  app.require_subcommand(1);
  // --help shows every option's default from the field it is bound to (the library's structs),
  // so that no help text restates one; subcommands inherit this.
  app.option_defaults()->always_capture_default();
  int threads = 0;  // 0: not given
  app.add_option("--threads", threads,
                 "CPU threads for intra-op parallelism (unset: CONVNN_NUM_THREADS, else all cores, divided among "
                 "torchrun's processes on this machine)")
      ->check(convnn::cli::explicit_value("CONVNN_NUM_THREADS, else all cores"))
      ->default_str("");  // its 0 means "not given", which the help says
  app.add_flag("--verbose", verbose_errors,
               "on an error, print everything the libraries underneath said, not only its first line");
  const std::vector<convnn::cli::Command> commands{
      convnn::cli::add_train_command(app),
      convnn::cli::add_eval_command(app),
      convnn::cli::add_generate_command(app),
      convnn::cli::add_compare_command(app),
      convnn::cli::add_verify_command(app),
      convnn::cli::add_bench_command(app),
      convnn::cli::add_info_command(app),
      convnn::cli::add_checkpoint_command(app),
      convnn::cli::add_viz_command(app),
  };
  // Every error reaches the user as one line of this form with status 1 (CLI11's own keep their
  // status): convnn's messages already name the option, the value and the rule, so a trace
  // would only hide them.
  app.failure_message([](const CLI::App* failed, const CLI::Error& e) {
    std::string message = one_line(e.what()), help = "convnn";
    for (const auto* sub : failed->get_subcommands()) help += " " + sub->get_name();
    // CLI11 reports a missing subcommand before the words it did not understand, which are
    // what the user typed wrong.
    if (failed->get_subcommands().empty() && !failed->remaining().empty()) {
      std::string names, typed;
      for (const auto* sub : failed->get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
      for (const auto& word : failed->remaining()) typed += (typed.empty() ? "" : " ") + word;
      message += " (one of " + names + "), got '" + typed + "'";
    }
    return "convnn: error: " + message + " (see " + help + " --help)\n";
  });
  // One handler for parsing and running: options such as --config and --resume read their files
  // in their callbacks, during app.parse, and so throw convnn's errors from it too.
  try {
    app.parse(argc, argv);
    at::set_num_threads(thread_count(threads));
    for (const auto& command : commands) {
      if (command.subcommand->parsed()) return command.run();
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const c10::Error& e) {
    return report_error(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return report_error(e.what());
  }
  return 0;
}
