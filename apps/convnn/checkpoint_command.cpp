// `convnn checkpoint convert`: rewrites a checkpoint of an older convnn (formats 1 to 3, whose
// optimiser state, or whole file, is a TorchScript archive) as plain data (format 4), which every
// other command reads without running anything from the file.
#include <fmt/format.h>

#include "commands.h"
#include "convnn/train/trainer.h"

namespace convnn::cli {
namespace {

struct ConvertArgs {
  std::string from;
  std::string to;
  bool trust_legacy = false;
};

int run_convert(const ConvertArgs& a) {
  TORCH_CHECK(a.trust_legacy, "convert opens '", a.from, "' as a TorchScript archive, which runs the code it may "
              "contain: pass --trust-legacy if the file comes from a source you trust (your own runs)");
  train::convert_checkpoint(a.from, a.to);
  fmt::print("{}: converted {} (plain data, format 4; resume and evaluate from it)\n", a.to, a.from);
  return 0;
}

}  // namespace

Command add_checkpoint_command(CLI::App& app) {
  auto* sub = app.add_subcommand("checkpoint", "Tools for checkpoint files");
  sub->require_subcommand(1);
  auto* convert = sub->add_subcommand(
      "convert", "Rewrite a checkpoint of an older convnn (formats 1 to 3) as plain data (format 4)");
  auto args = std::make_shared<ConvertArgs>();
  convert->add_option("OLD", args->from, "The checkpoint to convert")->required()->check(CLI::ExistingFile);
  convert->add_option("NEW", args->to, "The file to write (must not exist)")->required();
  convert->add_flag("--trust-legacy", args->trust_legacy,
                    "Open OLD although it is a TorchScript archive, which can run code: only for files from a "
                    "source you trust");
  convert->footer("Example:\n  convnn checkpoint convert runs/old/checkpoint-latest.pt runs/old/converted.pt "
                  "--trust-legacy\n");
  return {sub, [args] { return run_convert(*args); }};
}

}  // namespace convnn::cli
