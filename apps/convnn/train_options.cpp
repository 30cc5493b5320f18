#include "train_options.h"

#include <fmt/format.h>

#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "convnn/checkpoint/checkpoint.h"
#include "convnn/data/image_folder_source.h"
#include "model_options.h"

namespace convnn::cli {
namespace {

// Puts every option added since `first` into `group` (the sections of --help).
void group_since(CLI::App* sub, size_t first, const std::string& group) {
  const auto options = sub->get_options();
  for (size_t i = first; i < options.size(); ++i) const_cast<CLI::Option*>(options[i])->group(group);
}

// A pair of numbers, as timm's --opt-betas, --scale and --ratio; --help shows the struct's two.
void add_range_option(CLI::App* sub, const std::string& flag, double& min, double& max,
                      const std::string& help) {
  // false makes CLI11 report the values it could not convert, as for any other number.
  sub->add_option(flag, [&min, &max](const CLI::results_t& r) {
        return r.size() == 2 && CLI::detail::lexical_cast(r[0], min) && CLI::detail::lexical_cast(r[1], max);
      }, help)->expected(2)->type_name("FLOAT")
      ->default_function([&min, &max] { return CLI::detail::to_string(min) + " " + CLI::detail::to_string(max); })
      ->capture_default_str();
}

// The values the paper recipe gives the augmentation options left unset (data::apply_recipe on an
// image folder), for the help texts: the data library holds them.
data::AugmentationConfig paper_recipe() {
  data::DataConfig data;
  data.dataset = "imagefolder";
  data::AugmentationConfig augmentation;
  augmentation.recipe = data::Recipe::Paper;
  data::apply_recipe(data, augmentation);
  return augmentation;
}

// The RandAugment magnitude, or "off" (0). The recipe's is chosen by leaving it out.
void add_rand_augment_option(CLI::App* sub, std::optional<double>& magnitude, double paper) {
  sub->add_option_function<std::string>(
         "--rand-augment", [&magnitude](const std::string& s) { magnitude = s == "off" ? 0.0 : std::stod(s); },
         fmt::format("RandAugment magnitude M in [0, 10] (paper recipe {}, as timm's rand-m9-mstd0.5-inc1; 0 or "
                     "off: disabled)", paper))
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
  const auto paper = paper_recipe();
  // Left out: the recipe's value (train::validate checks a given one).
  add_enum_option(sub, "--recipe", c.augmentation.recipe, data::parse_recipe, data::recipe_names(),
                  fmt::format("Augmentation recipe: paper (DeiT/Swin: RandAugment, colour jitter {}, erasing {}, "
                              "mixup {}, cutmix {}) or none (crop and flip); unset: paper for imagefolder, none "
                              "otherwise. The options below override it",
                              *paper.color_jitter, *paper.reprob, *paper.mixup, *paper.cutmix));
  add_range_option(sub, "--scale", c.augmentation.scale_min, c.augmentation.scale_max,
                   "imagefolder: RandomResizedCrop area fraction");
  add_range_option(sub, "--ratio", c.augmentation.ratio_min, c.augmentation.ratio_max,
                   "imagefolder: RandomResizedCrop aspect ratio");
  add_rand_augment_option(sub, c.augmentation.rand_augment, *paper.rand_augment);
  sub->add_option("--rand-augment-ops", c.augmentation.rand_augment_ops, "RandAugment ops per image (0: off)");
  sub->add_option("--rand-augment-mstd", c.augmentation.rand_augment_mstd,
                  "RandAugment magnitude standard deviation (above 100: uniform in [0, M])");
  sub->add_option("--color-jitter", c.augmentation.color_jitter,
                  fmt::format("Colour jitter strength of brightness, contrast and saturation (paper recipe {}; "
                              "0: off)", *paper.color_jitter));
  sub->add_option("--reprob", c.augmentation.reprob,
                  fmt::format("Random erasing probability, mode pixel (paper recipe {}; 0: off)", *paper.reprob));
  sub->add_option("--mixup", c.augmentation.mixup, fmt::format("MixUp alpha (paper recipe {}; 0: off)", *paper.mixup));
  sub->add_option("--cutmix", c.augmentation.cutmix,
                  fmt::format("CutMix alpha (paper recipe {}; 0: off)", *paper.cutmix));
  sub->add_option("--mixup-switch-prob", c.augmentation.mixup_switch_prob,
                  "Probability of CutMix instead of MixUp when both are on");
  sub->add_option("--val-resize", c.data.val_resize,
                  fmt::format("imagefolder: shorter side before the validation centre crop (unset: image size / "
                              "0.875: {} for {})", data::default_val_resize(data::kDefaultFolderImageSize),
                              data::kDefaultFolderImageSize));
}

}  // namespace

void add_device_option(CLI::App* sub, std::string& device, const std::string& what, const std::string& note) {
  sub->add_option("--device", device,
                  what + ": cpu, cuda, cuda:N, mps, ... or auto (the accelerator when one is present, else "
                         "cpu)" + note)
      ->type_name("TEXT");
}

std::string resume_checkpoint_path(const std::string& resume) {
  return std::filesystem::is_directory(resume) ? checkpoint::latest_checkpoint_path(resume) : resume;
}

void add_trained_model_options(CLI::App* sub, train::TrainConfig& config) {
  const size_t first = sub->get_options().size();
  add_model_options(sub, config.model, config.model_config);
  // Bound to config.model: --help shows TrainConfig's model.
  sub->get_option("--model")->required(false)->default_str(config.model);
  for (const char* derived : {"--num-classes", "--in-channels", "--image-size"}) {
    sub->remove_option(sub->get_option(derived));  // taken from the data set
  }
  group_since(sub, first, kModelGroup);
}

namespace {

// The command's own keys of a config file (how it shows the run), taken out before the library
// reads the rest; null is "not given", as for every key.
void take_presentation(nlohmann::json& json, const std::string& path, Presentation& shown) {
  if (!json.is_object()) return;  // the library's reader names that error
  const auto take = [&](const char* key, auto& field, bool valid, const char* rule) {
    if (!json.contains(key)) return;
    const auto value = json[key];
    json.erase(key);
    if (value.is_null()) return;
    TORCH_CHECK(valid, "config file '", path, "': ", key, " must be ", rule, ", got ", value.dump());
    field = value.template get<std::decay_t<decltype(field)>>();
  };
  take("quiet", shown.quiet, json.contains("quiet") && json["quiet"].is_boolean(), "true or false");
  take("plots", shown.plots, json.contains("plots") && json["plots"].is_boolean(), "true or false");
  const auto& interval = json.contains("log_interval") ? json["log_interval"] : nlohmann::json();
  take("log_interval", shown.log_interval, interval.is_number_integer() && interval.get<int64_t>() >= 1,
       "an integer of at least 1");
}

}  // namespace

void add_train_options(CLI::App* sub, TrainArgs& args) {
  auto& c = args.config;
  const size_t run_first = sub->get_options().size();
  // Defined first so that their callbacks load the base config before any flag is applied.
  auto* config_option = sub->add_option_function<std::string>(
      "--config", [&args](const std::string& path) {
        args.config_file = path;
        auto json = train::read_config_file(path);
        take_presentation(json, path, args.presentation);
        args.config = train::read_config(json, path);
      },
      "JSON config file (keys as in a run's config.json); flags override it");
  auto* resume_option = sub->add_option_function<std::string>(
         "--resume", [&args](const std::string& path) {
           args.resumed = std::make_shared<checkpoint::Resumption>(resume_checkpoint_path(path));
           args.config = args.resumed->config();
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
                  "Data set (imagefolder: ImageNet-style folders of JPEG/PNG files)")
      ->check(CLI::IsMember(data::config_dataset_names()));
  sub->add_option("--data-dir", c.data.data_dir,
                  "Folder of the data set files (unset: /usr/share/datasets/fashion-mnist for "
                  "fashion-mnist, data/<dataset> otherwise; imagefolder: the root holding train/ and val/)");
  sub->add_option("--val-labels", c.data.val_labels,
                  "imagefolder: labels file of a flat val/ folder (unset: val_labels.txt or "
                  "LOC_val_solution.csv beside it)");
  sub->add_flag("--strict-data", c.data.strict_data,
                "imagefolder: stop at the first unreadable image file (without it: skip the file with a "
                "warning)");
  sub->add_option("--max-image-pixels", c.data.max_image_pixels,
                  "imagefolder: an image claiming more pixels (width x height) is unreadable (the default is "
                  "PIL's decompression-bomb limit)");
  sub->add_option("--train-subset", c.data.train_subset, "Train on n samples of a seeded shuffle (0: all)");
  sub->add_option("--val-subset", c.data.val_subset,
                  "Evaluate on n test samples of a seeded shuffle (0: all)");
  sub->add_option("-j,--workers", c.data.workers, "Data loader threads");
  sub->add_option("--prefetch", c.data.prefetch, "Batches the loader keeps ready");
  group_since(sub, first, "Dataset parameters");

  add_trained_model_options(sub, c);
  sub->add_option("--image-size", c.data.image_size,
                  fmt::format("imagefolder: side of the training and validation crops (unset: {}; the other "
                              "data sets keep their own size)", data::kDefaultFolderImageSize))
      ->group("Dataset parameters");

  first = sub->get_options().size();
  add_enum_option(sub, "--opt", c.optimization.optimizer, train::parse_optimizer, train::optimizer_names(),
                  "Optimizer");
  sub->add_option("--weight-decay", c.optimization.weight_decay, "Weight decay");
  add_enum_option(sub, "--decay-on", c.optimization.decay_on, train::parse_decay_on, train::decay_on_names(),
                  "Weight decay on all parameters or only on weights, not biases/norms/embeddings");
  add_range_option(sub, "--opt-betas", c.optimization.beta1, c.optimization.beta2, "AdamW betas");
  sub->add_option("--opt-eps", c.optimization.eps, "AdamW epsilon");
  sub->add_option("--momentum", c.optimization.momentum, "SGD momentum");
  sub->add_flag("--nesterov", c.optimization.nesterov, "SGD: Nesterov momentum");
  sub->add_option("--clip-grad", c.optimization.clip_grad,
                  "Clip the gradients' global L2 norm (0: off)");
  sub->add_option("--grad-accum-steps", c.optimization.accum_steps, "Batches per optimizer step");
  sub->add_option("-b,--batch-size", c.optimization.batch_size, "Batch size");
  group_since(sub, first, "Optimizer parameters");

  first = sub->get_options().size();
  add_enum_option(sub, "--sched", c.optimization.schedule, train::parse_schedule, train::schedule_names(),
                  "Schedule after the warm-up, stepped per iteration");
  sub->add_option("--lr", c.optimization.lr, "Learning rate");
  sub->add_option("--epochs", c.optimization.epochs, "Epochs");
  sub->add_option("--warmup-epochs", c.optimization.warmup_epochs, "Linear warm-up epochs, may be fractional");
  sub->add_option("--warmup-lr", c.optimization.warmup_lr, "Learning rate at the start of the warm-up");
  sub->add_option("--min-lr", c.optimization.min_lr, "Learning rate at the end of the cosine");
  group_since(sub, first, "Learning rate schedule parameters");

  first = sub->get_options().size();
  sub->add_option("--smoothing", c.optimization.smoothing, "Label smoothing");
  sub->add_option(
      "--crop-padding", c.augmentation.crop_padding,
      "Random crop from the zero-padded image (unset: 2 px for 28 px images, 4 for 32; 0: off)");
  sub->add_option("--hflip", c.augmentation.hflip, "Horizontal flip probability (unset: 0.5; 0 for mnist)");
  add_augmentation_options(sub, c);
  group_since(sub, first, "Augmentation and regularization parameters");

  first = sub->get_options().size();
  add_enum_option(sub, "--precision", c.optimization.precision, train::parse_precision, train::precision_names(),
                  "Compute precision; bfloat16 runs the forward under autocast; float64 runs everything in "
                  "double, slowly, for numerical checks");
  sub->add_flag_callback(
      "--amp", [&c] { c.optimization.precision = train::Precision::BFloat16; },
      "Same as --precision bfloat16");
  add_device_option(sub, args.device, "Device of the model, loss, metrics and optimiser",
                    ". Not part of the run's config: a run resumes on any device");
  sub->add_option("--seed", c.run.seed, "Seed of the model initialisation, shuffling and augmentation")
      ->check(seed_value());
  sub->add_option("--output", c.run.output, "Folder of the run directories");
  sub->add_option("--experiment", c.run.experiment, "Run directory name (unset: <model>-<dataset>-<time>)");
  auto& shown = args.presentation;
  sub->add_option("--log-interval", shown.log_interval, "Batches between log lines without a terminal")
      ->check(integer_at_least(1));
  sub->add_flag("--quiet,--plain", shown.quiet, "Plain log lines instead of a progress bar");
  sub->add_flag("!--no-plots", shown.plots, "Do not draw PNG plots");
  group_since(sub, first, "Miscellaneous parameters");
}

}  // namespace convnn::cli
