// `convnn generate`: samples text from a language model's checkpoint (one trained by `convnn train`
// on a text data set), one token at a time with the model's key/value caches.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "model_options.h"
#include "convnn/checkpoint/checkpoint.h"
#include "convnn/data/text.h"
#include "convnn/models/language_model.h"
#include "convnn/train/trainer.h"
#include "convnn/util/device.h"
#include "train_options.h"

namespace convnn::cli {
namespace {

struct GenerateArgs {
  std::string checkpoint;
  std::string prompt = "%\n";  // the corpus's document separator: a fresh document
  int64_t max_new_tokens = 200;
  int64_t samples = 1;
  models::SamplingOptions sampling;
  uint64_t seed = 0;
  std::string device = "auto";
  bool speed = false;
};

int run_generate(const GenerateArgs& a) {
  const auto device = resolve_device(a.device, "--device");
  const auto path = resume_checkpoint_path(a.checkpoint);
  TORCH_CHECK(checkpoint::holds_run(path), "--checkpoint '", path,
              "' holds weights alone; convnn generate reads the checkpoint of a run of `convnn train`, "
              "which names its model");
  const auto config = checkpoint::read_checkpoint_header(path).config;
  TORCH_CHECK(models::model_entry(config.model).family == models::ModelFamily::LanguageModel, "--checkpoint '", path,
              "' holds ", config.model, ", which is not a language model (the language models: ",
              fmt::format("{}", fmt::join(models::model_names(models::ModelFamily::LanguageModel), ", ")), ")");
  TORCH_CHECK(!a.prompt.empty(), "--prompt must hold at least one character (the model continues it)");
  auto model = train::make_model(config, device);
  checkpoint::load_checkpoint(path, *model.module(), nullptr);
  const auto prompt = data::encode_bytes(a.prompt).unsqueeze(0).expand({a.samples, -1}).contiguous();
  auto& network = *model.get<models::LanguageModelImpl>();
  const auto start = std::chrono::steady_clock::now();
  const auto tokens = models::generate(network, prompt, a.max_new_tokens, a.sampling, a.seed).cpu();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int64_t i = 0; i < a.samples; ++i) {
    if (a.samples > 1) fmt::print("--- sample {} of {}\n", i + 1, a.samples);
    fmt::print("{}\n", data::decode_bytes(tokens[i]));
  }
  std::fflush(stdout);
  if (a.speed) {
    fmt::print(stderr, "generated {} x {} tokens after a prompt of {} in {:.3f} s: {:.0f} tokens/s\n", a.samples,
               a.max_new_tokens, prompt.size(1), seconds, static_cast<double>(a.samples * a.max_new_tokens) / seconds);
  }
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  auto* sub = app.add_subcommand("generate", "Sample text from a language model's checkpoint");
  auto args = std::make_shared<GenerateArgs>();
  sub->add_option("--checkpoint", args->checkpoint, "Checkpoint of a language model's run, or its run directory")
      ->required();
  sub->add_option("--prompt", args->prompt, "Text the model continues (bytes; \"%\\n\" starts a fresh fortune)")
      ->capture_default_str();
  sub->add_option("-n,--max-new-tokens", args->max_new_tokens,
                  "Tokens to sample after the prompt (prompt and samples fit in the model's context)")
      ->capture_default_str()
      ->check(integer_at_least(0));
  sub->add_option("--temperature", args->sampling.temperature,
                  "Divides the logits before sampling; 0 takes the most likely token")
      ->capture_default_str();
  sub->add_option("--top-k", args->sampling.top_k, "Sample among the k most likely tokens only; 0: all")
      ->capture_default_str();
  sub->add_option("--seed", args->seed, "Seed of the sampling: the same seed, the same text")
      ->capture_default_str()
      ->check(seed_value());
  sub->add_option("--samples", args->samples, "Continuations of the prompt, sampled side by side")
      ->capture_default_str()
      ->check(integer_at_least(1));
  add_device_option(sub, args->device, "Device to load the model onto and sample on");
  sub->add_flag("--speed", args->speed,
                "Also print on stderr how long the sampling took (the prompt read and every step; not the loading)");
  sub->footer(
      "Examples:\n"
      "  convnn generate --checkpoint runs/<run>                      # a fresh fortune\n"
      "  convnn generate --checkpoint runs/<run> --prompt \"The \" --temperature 0.8 --top-k 20 --seed 1\n");
  return {sub, [args] { return run_generate(*args); }};
}

}  // namespace convnn::cli
