#include "train_options.h"

#include <filesystem>
#include <vector>

#include "convnn/checkpoint/checkpoint.h"
#include "model_options.h"

namespace convnn::cli {
namespace {

// Puts every option added since `first` into `group` (the sections of --help).
void group_since(CLI::App* sub, size_t first, const std::string& group) {
  const auto options = sub->get_options();
  for (size_t i = first; i < options.size(); ++i) const_cast<CLI::Option*>(options[i])->group(group);
}

// A pair of numbers, as timm's --opt-betas, --scale and --ratio.
void add_range_option(CLI::App* sub, const std::string& flag, double& min, double& max,
                      const std::string& help) {
  // false makes CLI11 report the values it could not convert, as for any other number.
  sub->add_option(flag, [&min, &max](const CLI::results_t& r) {
        return r.size() == 2 && CLI::detail::lexical_cast(r[0], min) && CLI::detail::lexical_cast(r[1], max);
      }, help)->expected(2)->type_name("FLOAT");
}

// The RandAugment magnitude, or "off" (0). The recipe's is chosen by leaving it out.
void add_rand_augment_option(CLI::App* sub, std::optional<double>& magnitude) {
  sub->add_option_function<std::string>(
         "--rand-augment", [&magnitude](const std::string& s) { magnitude = s == "off" ? 0.0 : std::stod(s); },
         "RandAugment magnitude M in [0, 10] (paper recipe 9, timm's rand-m9-mstd0.5-inc1; 0 or off: disabled)")
      ->type_name("M|off")
      ->check([](const std::string& s) {
        if (s == "off") return std::string();
        try {
          size_t used = 0;
          std::stod(s, &used);
          if (used == s.size()) return std::string();
        } catch (const std::exception&) {
        }
        return "expected a number or off, got '" + s + "' (leave the flag out for the recipe's value)";
      });
}

void add_augmentation_options(CLI::App* sub, train::TrainConfig& c) {
  // Left out: the recipe's value (train::validate checks a given one).
  add_enum_option(sub, "--recipe", c.augmentation.recipe, data::parse_recipe, {"paper", "none"},
                  "Augmentation recipe: paper (DeiT/Swin: RandAugment, colour jitter 0.4, erasing 0.25, "
                  "mixup 0.8, cutmix 1.0) or none (crop and flip); default paper for imagefolder, none "
                  "otherwise. The options below override it");
  add_range_option(sub, "--scale", c.augmentation.scale_min, c.augmentation.scale_max,
                   "imagefolder: RandomResizedCrop area fraction (default 0.08 1)");
  add_range_option(sub, "--ratio", c.augmentation.ratio_min, c.augmentation.ratio_max,
                   "imagefolder: RandomResizedCrop aspect ratio (default 0.75 1.3333)");
  add_rand_augment_option(sub, c.augmentation.rand_augment);
  sub->add_option("--rand-augment-ops", c.augmentation.rand_augment_ops,
                  "RandAugment ops per image (default 2; 0: off)");
  sub->add_option("--rand-augment-mstd", c.augmentation.rand_augment_mstd,
                  "RandAugment magnitude standard deviation (default 0.5; above 100: uniform in [0, M])");
  sub->add_option("--color-jitter", c.augmentation.color_jitter,
                  "Colour jitter strength of brightness, contrast and saturation (paper recipe 0.4; 0: off)");
  sub->add_option("--reprob", c.augmentation.reprob,
                  "Random erasing probability, mode pixel (paper recipe 0.25; 0: off)");
  sub->add_option("--mixup", c.augmentation.mixup, "MixUp alpha (paper recipe 0.8; 0: off)");
  sub->add_option("--cutmix", c.augmentation.cutmix, "CutMix alpha (paper recipe 1.0; 0: off)");
  sub->add_option("--mixup-switch-prob", c.augmentation.mixup_switch_prob,
                  "Probability of CutMix instead of MixUp when both are on (default 0.5)");
  sub->add_option("--val-resize", c.data.val_resize,
                  "imagefolder: shorter side before the validation centre crop (default image size / "
                  "0.875: 256 for 224)");
}

}  // namespace

void add_device_option(CLI::App* sub, std::string& device, const std::string& what, const std::string& note) {
  sub->add_option("--device", device,
                  what + ": cpu, cuda, cuda:N, mps, ... or auto (default auto: the accelerator when one is "
                         "present, else cpu)" + note)
      ->type_name("TEXT");
}

std::string resume_checkpoint_path(const std::string& resume) {
  return std::filesystem::is_directory(resume) ? checkpoint::latest_checkpoint_path(resume) : resume;
}

void add_trained_model_options(CLI::App* sub, train::TrainConfig& config) {
  const size_t first = sub->get_options().size();
  add_model_options(sub, config.model, config.model_config);
  sub->get_option("--model")->required(false)->description("Model name (default resnet18)");
  for (const char* derived : {"--num-classes", "--in-channels", "--image-size"}) {
    sub->remove_option(sub->get_option(derived));  // taken from the data set
  }
  group_since(sub, first, kModelGroup);
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
  auto* resume_option = sub->add_option_function<std::string>(
         "--resume", [&args](const std::string& path) {
           args.resume = resume_checkpoint_path(path);
           args.config = checkpoint::read_checkpoint_header(args.resume).config;
         },
         "Continue the run of this checkpoint (or run directory) exactly where it stopped")
      ->excludes(config_option);
  sub->add_option("--initial-checkpoint", c.run.initial_checkpoint,
                  "Start from these weights (a convnn checkpoint, or a state_dict saved by Python's "
                  "torch.save) with a fresh optimiser at epoch 0: fine-tuning")
      ->excludes(resume_option);
  group_since(sub, run_first, "Run");

  size_t first = sub->get_options().size();
  sub->add_option("--dataset", c.data.dataset,
                  "Data set (default fashion-mnist; imagefolder: ImageNet-style folders of JPEG/PNG files)")
      ->check(CLI::IsMember(data::config_dataset_names()));
  sub->add_option("--data-dir", c.data.data_dir,
                  "Folder of the data set files (default: /usr/share/datasets/fashion-mnist for "
                  "fashion-mnist, data/<dataset> otherwise; imagefolder: the root holding train/ and val/)");
  sub->add_option("--val-labels", c.data.val_labels,
                  "imagefolder: labels file of a flat val/ folder (default: val_labels.txt or "
                  "LOC_val_solution.csv beside it)");
  sub->add_flag("--strict-data", c.data.strict_data,
                "imagefolder: stop at the first unreadable image file (default: skip it with a warning)");
  sub->add_option("--max-image-pixels", c.data.max_image_pixels,
                  "imagefolder: an image claiming more pixels (width x height) is unreadable (default "
                  "178956970, PIL's decompression-bomb limit)");
  sub->add_option("--train-subset", c.data.train_subset, "Train on n samples of a seeded shuffle (0: all)");
  sub->add_option("--val-subset", c.data.val_subset,
                  "Evaluate on n test samples of a seeded shuffle (0: all)");
  sub->add_option("-j,--workers", c.data.workers, "Data loader threads (default 2)");
  sub->add_option("--prefetch", c.data.prefetch, "Batches the loader keeps ready (default 4)");
  group_since(sub, first, "Dataset parameters");

  add_trained_model_options(sub, c);
  sub->add_option("--image-size", c.data.image_size,
                  "imagefolder: side of the training and validation crops (default 224; the other data "
                  "sets keep their own size)")
      ->group("Dataset parameters");

  first = sub->get_options().size();
  add_enum_option(sub, "--opt", c.optimization.optimizer, train::parse_optimizer, {"adamw", "sgd"},
                  "Optimizer (default adamw)");
  sub->add_option("--weight-decay", c.optimization.weight_decay, "Weight decay (default 0.05)");
  add_enum_option(
      sub, "--decay-on", c.optimization.decay_on, train::parse_decay_on, {"all", "weights"},
      "Weight decay on all parameters or only on weights, not biases/norms/embeddings (default all)");
  add_range_option(sub, "--opt-betas", c.optimization.beta1, c.optimization.beta2,
                   "AdamW betas (default 0.9 0.999)");
  sub->add_option("--opt-eps", c.optimization.eps, "AdamW epsilon (default 1e-8)");
  sub->add_option("--momentum", c.optimization.momentum, "SGD momentum (default 0.9)");
  sub->add_flag("--nesterov", c.optimization.nesterov, "SGD: Nesterov momentum");
  sub->add_option("--clip-grad", c.optimization.clip_grad,
                  "Clip the gradients' global L2 norm (default 5; 0: off)");
  sub->add_option("--grad-accum-steps", c.optimization.accum_steps, "Batches per optimizer step (default 1)");
  sub->add_option("-b,--batch-size", c.optimization.batch_size, "Batch size (default 128)");
  group_since(sub, first, "Optimizer parameters");

  first = sub->get_options().size();
  add_enum_option(sub, "--sched", c.optimization.schedule, train::parse_schedule, {"cosine", "constant"},
                  "Schedule after the warm-up, stepped per iteration (default cosine)");
  sub->add_option("--lr", c.optimization.lr, "Learning rate (default 1e-3)");
  sub->add_option("--epochs", c.optimization.epochs, "Epochs (default 300)");
  sub->add_option("--warmup-epochs", c.optimization.warmup_epochs,
                  "Linear warm-up epochs, may be fractional (default 20)");
  sub->add_option("--warmup-lr", c.optimization.warmup_lr,
                  "Learning rate at the start of the warm-up (default 1e-7)");
  sub->add_option("--min-lr", c.optimization.min_lr, "Learning rate at the end of the cosine (default 5e-6)");
  group_since(sub, first, "Learning rate schedule parameters");

  first = sub->get_options().size();
  sub->add_option("--smoothing", c.optimization.smoothing, "Label smoothing (default 0.1)");
  sub->add_option(
      "--crop-padding", c.augmentation.crop_padding,
      "Random crop from the zero-padded image (default: 2 px for 28 px images, 4 for 32; 0: off)");
  sub->add_option("--hflip", c.augmentation.hflip, "Horizontal flip probability (default 0.5; 0 for mnist)");
  add_augmentation_options(sub, c);
  group_since(sub, first, "Augmentation and regularization parameters");

  first = sub->get_options().size();
  add_enum_option(
      sub, "--precision", c.optimization.precision, train::parse_precision,
      {"float32", "bfloat16", "float64"},
      "Compute precision; bfloat16 runs the forward under autocast; float64 runs everything in double, "
      "slowly, for numerical checks (default float32)");
  sub->add_flag_callback(
      "--amp", [&c] { c.optimization.precision = train::Precision::BFloat16; },
      "Same as --precision bfloat16");
  add_device_option(sub, args.device, "Device of the model, loss, metrics and optimiser",
                    ". Not part of the run's config: a run resumes on any device");
  sub->add_option("--seed", c.run.seed,
                  "Seed of the model initialisation, shuffling and augmentation (default 0)");
  sub->add_option("--output", c.run.output, "Folder of the run directories (default runs)");
  sub->add_option("--experiment", c.run.experiment, "Run directory name (default <model>-<dataset>-<time>)");
  sub->add_option("--log-interval", c.run.log_interval,
                  "Batches between log lines without a terminal (default 50)");
  sub->add_flag("--quiet,--plain", c.run.quiet, "Plain log lines instead of a progress bar");
  sub->add_flag("!--no-plots", c.run.plots, "Do not draw PNG plots");
  group_since(sub, first, "Miscellaneous parameters");
}

}  // namespace convnn::cli
