#include "train_options.h"

#include <filesystem>
#include <vector>

#include "convnn/data/datasets.h"
#include "convnn/train/checkpoint.h"
#include "model_options.h"

namespace convnn::cli {
namespace {

// Puts every option added since `first` into `group` (the sections of --help).
void group_since(CLI::App* sub, size_t first, const std::string& group) {
  const auto options = sub->get_options();
  for (size_t i = first; i < options.size(); ++i) const_cast<CLI::Option*>(options[i])->group(group);
}

}  // namespace

std::string resume_checkpoint_path(const std::string& resume) {
  return std::filesystem::is_directory(resume) ? train::latest_checkpoint_path(resume) : resume;
}

void add_train_options(CLI::App* sub, TrainArgs& args) {
  auto& c = args.config;
  const size_t run_first = sub->get_options().size();
  // Defined first so that their callbacks load the base config before any flag is applied.
  auto* config_option = sub->add_option_function<std::string>(
      "--config", [&args](const std::string& path) {
        args.config_file = path;
        args.config = train::read_config(path);
      },
      "JSON config file (keys as in a run's config.json); flags override it");
  sub->add_option_function<std::string>(
         "--resume", [&args](const std::string& path) {
           args.resume = resume_checkpoint_path(path);
           args.config = train::read_checkpoint_header(args.resume).config;
         },
         "Continue the run of this checkpoint (or run directory) exactly where it stopped")
      ->excludes(config_option);
  group_since(sub, run_first, "Run");

  size_t first = sub->get_options().size();
  sub->add_option("--dataset", c.dataset, "Data set (default fashion-mnist)")
      ->check(CLI::IsMember(data::dataset_names()));
  sub->add_option("--data-dir", c.data_dir,
                  "Folder of the data set files (default: /usr/share/datasets/fashion-mnist for "
                  "fashion-mnist, data/<dataset> otherwise)");
  sub->add_option("--train-subset", c.train_subset, "Train on n samples of a seeded shuffle (0: all)");
  sub->add_option("--val-subset", c.val_subset, "Evaluate on n test samples of a seeded shuffle (0: all)");
  sub->add_option("-j,--workers", c.workers, "Data loader threads (default 2)");
  sub->add_option("--prefetch", c.prefetch, "Batches the loader keeps ready (default 4)");
  group_since(sub, first, "Dataset parameters");

  first = sub->get_options().size();
  add_model_options(sub, c.model, c.model_config);
  sub->get_option("--model")->required(false)->description("Model name (default resnet18)");
  for (const char* derived : {"--num-classes", "--in-channels", "--image-size"}) {
    sub->remove_option(sub->get_option(derived));  // taken from the data set
  }
  group_since(sub, first, "Model parameters");

  first = sub->get_options().size();
  add_enum_option(sub, "--opt", c.optimizer, train::parse_optimizer, {"adamw", "sgd"}, "Optimizer (default adamw)");
  sub->add_option("--weight-decay", c.weight_decay, "Weight decay (default 0.05)");
  add_enum_option(sub, "--decay-on", c.decay_on, train::parse_decay_on, {"all", "weights"},
           "Weight decay on all parameters or only on weights, not biases/norms/embeddings (default all)");
  sub->add_option("--opt-betas", [&c](const CLI::results_t& r) {
        c.beta1 = std::stod(r.at(0));
        c.beta2 = std::stod(r.at(1));
        return true;
      }, "AdamW betas (default 0.9 0.999)")->expected(2)->type_name("FLOAT FLOAT");
  sub->add_option("--opt-eps", c.eps, "AdamW epsilon (default 1e-8)");
  sub->add_option("--momentum", c.momentum, "SGD momentum (default 0.9)");
  sub->add_flag("--nesterov", c.nesterov, "SGD: Nesterov momentum");
  sub->add_option("--clip-grad", c.clip_grad, "Clip the gradients' global L2 norm (default 5; 0: off)");
  sub->add_option("--grad-accum-steps", c.accum_steps, "Batches per optimizer step (default 1)");
  sub->add_option("-b,--batch-size", c.batch_size, "Batch size (default 128)");
  group_since(sub, first, "Optimizer parameters");

  first = sub->get_options().size();
  add_enum_option(sub, "--sched", c.schedule, train::parse_schedule, {"cosine", "constant"},
           "Schedule after the warm-up, stepped per iteration (default cosine)");
  sub->add_option("--lr", c.lr, "Learning rate (default 1e-3)");
  sub->add_option("--epochs", c.epochs, "Epochs (default 300)");
  sub->add_option("--warmup-epochs", c.warmup_epochs, "Linear warm-up epochs, may be fractional (default 20)");
  sub->add_option("--warmup-lr", c.warmup_lr, "Learning rate at the start of the warm-up (default 1e-7)");
  sub->add_option("--min-lr", c.min_lr, "Learning rate at the end of the cosine (default 5e-6)");
  group_since(sub, first, "Learning rate schedule parameters");

  first = sub->get_options().size();
  sub->add_option("--smoothing", c.smoothing, "Label smoothing (default 0.1)");
  sub->add_option("--crop-padding", c.crop_padding,
                  "Random crop from the zero-padded image (default: 2 px for 28 px images, 4 for 32; 0: off)");
  sub->add_option("--hflip", c.hflip, "Horizontal flip probability (default 0.5; 0 for mnist)");
  group_since(sub, first, "Augmentation and regularization parameters");

  first = sub->get_options().size();
  add_enum_option(sub, "--precision", c.precision, train::parse_precision, {"float32", "bfloat16"},
           "Compute precision; bfloat16 runs the forward under autocast (default float32)");
  sub->add_flag_callback("--amp", [&c] { c.precision = train::Precision::BFloat16; },
                         "Same as --precision bfloat16");
  sub->add_option("--seed", c.seed, "Seed of the model initialisation, shuffling and augmentation (default 0)");
  sub->add_option("--output", c.output, "Folder of the run directories (default runs)");
  sub->add_option("--experiment", c.experiment, "Run directory name (default <model>-<dataset>-<time>)");
  sub->add_option("--log-interval", c.log_interval, "Batches between log lines without a terminal (default 50)");
  sub->add_flag("--quiet,--plain", c.quiet, "Plain log lines instead of a progress bar");
  sub->add_flag("!--no-plots", c.plots, "Do not draw PNG plots");
  group_since(sub, first, "Miscellaneous parameters");
}

}  // namespace convnn::cli
