// The data and augmentation sections of a training config: their rules and the recipes.
#include "convnn/data/config.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "convnn/data/datasets.h"
#include "convnn/data/image_folder_source.h"
#include "convnn/data/text.h"
#include "util/enum_names.h"
#include "util/value_checks.h"

namespace convnn::data {
namespace {

constexpr convnn::detail::NameTable<Recipe, 2> kRecipes{{{"paper", Recipe::Paper}, {"none", Recipe::None}}};
constexpr const char* kImageFolder = "imagefolder";

// The values a recipe gives the unset augmentation fields (label smoothing 0.1 and the
// validation resize are the same in both). Paper: timm's DeiT / Swin settings.
struct RecipeValues {
  double rand_augment, color_jitter, reprob, mixup, cutmix;
};
constexpr RecipeValues kPaperRecipe{9.0, 0.4, 0.25, 0.8, 1.0};
constexpr RecipeValues kNoRecipe{0.0, 0.0, 0.0, 0.0, 0.0};

// An optional value: unset, or one that `valid` accepts.
template <typename T, typename Valid>
void check_optional(const std::optional<T>& value, const char* option, const char* rule, const char* unset,
                    Valid valid) {
  TORCH_CHECK(!value || (std::isfinite(static_cast<double>(*value)) && valid(*value)), option, " must be ",
              rule, " (or unset: ", unset, "), got ", value ? fmt::format("{}", *value) : std::string());
}

void check_dataset(const DataConfig& d) {
  const auto& names = config_dataset_names();
  if (std::find(names.begin(), names.end(), d.dataset) != names.end()) return;
  std::string allowed;
  for (const auto& name : names) allowed += (allowed.empty() ? "" : ", ") + name;
  TORCH_CHECK(false, "dataset must be one of ", allowed, "; got '", d.dataset, "'");
}

void check_data(const DataConfig& d) {
  check_dataset(d);
  check_optional(d.image_size, "image_size", ">= 1", "224", [](int64_t v) { return v >= 1; });
  check_optional(d.val_resize, "val_resize", ">= 1", "image_size / 0.875", [](int64_t v) { return v >= 1; });
  TORCH_CHECK(d.train_subset >= 0, "train_subset must be >= 0 (0: all), got ", d.train_subset);
  TORCH_CHECK(d.val_subset >= 0, "val_subset must be >= 0 (0: all), got ", d.val_subset);
  TORCH_CHECK(d.workers >= 0, "workers must be >= 0, got ", d.workers);
  // Each prefetched batch is held in memory: a value past this is a typo (or a hostile file), not
  // a faster loader.
  TORCH_CHECK(d.prefetch >= 1 && d.prefetch <= 1024, "prefetch must be in [1, 1024] (batches per loader "
              "thread), got ", d.prefetch);
  TORCH_CHECK(d.max_image_pixels >= 1, "max_image_pixels must be >= 1 (default ", kDefaultMaxImagePixels,
              "), got ", d.max_image_pixels);
}

void check_augmentation(const AugmentationConfig& a) {
  TORCH_CHECK(a.scale_min >= 0.0 && a.scale_min <= a.scale_max && a.scale_max > 0.0 && a.scale_max <= 1.0,
              "scale must be (min, max) with 0 <= min <= max <= 1 and max > 0, got (", a.scale_min, ", ",
              a.scale_max, ")");
  TORCH_CHECK(std::isfinite(a.ratio_max) && a.ratio_min > 0.0 && a.ratio_min <= a.ratio_max,
              "ratio must be a finite (min, max) with 0 < min <= max, got (", a.ratio_min, ", ", a.ratio_max,
              ")");
  const auto non_negative = [](double v) { return v >= 0.0; };
  const auto probability = [](double v) { return v <= 1.0 && v >= 0.0; };
  // The padded image is allocated per sample: 1024 pixels on each side is past any crop's use.
  check_optional(a.crop_padding, "crop_padding", "in [0, 1024] (0: off)", "the data set's default",
                 [](int64_t v) { return v >= 0 && v <= 1024; });
  check_optional(a.hflip, "hflip", "a probability in [0, 1]", "the data set's default", probability);
  check_optional(a.rand_augment, "rand_augment", "a magnitude in [0, 10] (0: off)", "the recipe's value",
                 [](double v) { return v >= 0.0 && v <= 10.0; });
  TORCH_CHECK(a.rand_augment_ops >= 0, "rand_augment_ops must be >= 0 (0: off), got ", a.rand_augment_ops);
  convnn::detail::check_finite_non_negative(a.rand_augment_mstd, "rand_augment_mstd");
  check_optional(a.color_jitter, "color_jitter", ">= 0 (0: off)", "the recipe's value", non_negative);
  check_optional(a.reprob, "reprob", "a probability in [0, 1]", "the recipe's value", probability);
  check_optional(a.mixup, "mixup", "an alpha >= 0 (0: off)", "the recipe's value", non_negative);
  check_optional(a.cutmix, "cutmix", "an alpha >= 0 (0: off)", "the recipe's value", non_negative);
  TORCH_CHECK(probability(a.mixup_switch_prob), "mixup_switch_prob must be in [0, 1], got ",
              a.mixup_switch_prob);
}

// Options that mean something for one kind of data set only are errors with the others, rather
// than silently ignored. The image folders' options, refused for any other data set with `why`.
void check_folder_options_off(const DataConfig& d, const AugmentationConfig& a, const std::string& why) {
  const auto only = [&](bool unset, const char* option, const auto& value) {
    TORCH_CHECK(unset, option, why, value, " with dataset ", d.dataset);
  };
  const auto off = [](const std::optional<double>& v) { return !v || *v == 0.0; };
  only(!d.image_size, "image_size", d.image_size.value_or(0));
  only(!d.val_resize, "val_resize", d.val_resize.value_or(0));
  only(d.val_labels.empty(), "val_labels", d.val_labels);
  only(a.recipe != Recipe::Paper, "recipe paper", "paper");
  only(off(a.rand_augment), "rand_augment", a.rand_augment.value_or(0));
  only(off(a.color_jitter), "color_jitter", a.color_jitter.value_or(0));
  only(off(a.reprob), "reprob", a.reprob.value_or(0));
  const AugmentationConfig defaults;
  only(a.scale_min == defaults.scale_min && a.scale_max == defaults.scale_max, "scale",
       fmt::format("({}, {})", a.scale_min, a.scale_max));
  only(a.ratio_min == defaults.ratio_min && a.ratio_max == defaults.ratio_max, "ratio",
       fmt::format("({}, {})", a.ratio_min, a.ratio_max));
}

// A text set has no image to augment: the in-memory sets' transforms are off too.
void check_text(const DataConfig& d, const AugmentationConfig& a) {
  const std::string why = " is an image option; dataset " + d.dataset +
                          " is text (byte tokens in windows of the model's context), got ";
  check_folder_options_off(d, a, why);
  const auto zero = [](const auto& v) { return !v || *v == 0; };
  const auto off = [&](bool is_off, const char* option, double value) {
    TORCH_CHECK(is_off, option, why, value, " with dataset ", d.dataset);
  };
  off(zero(a.crop_padding), "crop_padding", static_cast<double>(a.crop_padding.value_or(0)));
  off(zero(a.hflip), "hflip", a.hflip.value_or(0));
  off(zero(a.mixup), "mixup", a.mixup.value_or(0));
  off(zero(a.cutmix), "cutmix", a.cutmix.value_or(0));
}

void check_image_folder(const DataConfig& d, const AugmentationConfig& a) {
  TORCH_CHECK(!d.data_dir.empty(),
              "data_dir must name the root of the image folders (train/ and val/ inside) for "
              "dataset imagefolder");
  TORCH_CHECK(a.crop_padding.value_or(0) == 0,
              "crop_padding applies to the in-memory data "
              "sets; dataset imagefolder crops with RandomResizedCrop (scale, ratio), got crop_padding ",
              a.crop_padding.value_or(0));
  const int64_t size = d.image_size.value_or(kDefaultFolderImageSize);
  TORCH_CHECK(!d.val_resize || *d.val_resize >= size, "val_resize must be >= image_size (", size,
              ") or unset (image_size / 0.875), got ", d.val_resize.value_or(0));
}

}  // namespace

Recipe parse_recipe(const std::string& name) { return convnn::detail::parse_name(kRecipes, name, "recipe"); }
std::string to_string(Recipe value) { return convnn::detail::name_of(kRecipes, value); }
const std::vector<std::string>& recipe_names() { return convnn::detail::table_names<kRecipes>(); }

const std::vector<std::string>& config_dataset_names() {
  static const std::vector<std::string> names = [] {
    auto all = dataset_names();
    all.push_back(kImageFolder);
    for (const auto& name : text_dataset_names()) all.push_back(name);
    return all;
  }();
  return names;
}

bool is_image_folder(const DataConfig& config) { return config.dataset == kImageFolder; }

void validate(const DataConfig& data, const AugmentationConfig& augmentation) {
  // Each value's own rule first, then the rules between values.
  check_data(data);
  check_augmentation(augmentation);
  if (is_image_folder(data)) {
    check_image_folder(data, augmentation);
  } else if (is_text_dataset(data.dataset)) {
    check_text(data, augmentation);
  } else {
    check_folder_options_off(data, augmentation,
                             " applies to dataset imagefolder only (the in-memory data sets keep their size and "
                             "train with crop padding and flip), got ");
  }
}

void apply_recipe(DataConfig& d, AugmentationConfig& a) {
  if (!a.recipe) a.recipe = is_image_folder(d) ? Recipe::Paper : Recipe::None;
  const auto& values = *a.recipe == Recipe::Paper ? kPaperRecipe : kNoRecipe;
  if (!a.rand_augment) a.rand_augment = values.rand_augment;
  if (!a.color_jitter) a.color_jitter = values.color_jitter;
  if (!a.reprob) a.reprob = values.reprob;
  if (!a.mixup) a.mixup = values.mixup;
  if (!a.cutmix) a.cutmix = values.cutmix;
  // Digits are not mirror-symmetric; text has no image.
  if (is_text_dataset(d.dataset)) {
    if (!a.hflip) a.hflip = 0.0;
    if (!a.crop_padding) a.crop_padding = 0;
    return;
  }
  if (!a.hflip) a.hflip = d.dataset == to_string(DatasetKind::Mnist) ? 0.0 : 0.5;
  if (is_image_folder(d)) {
    if (!d.image_size) d.image_size = kDefaultFolderImageSize;
    if (!d.val_resize) d.val_resize = default_val_resize(*d.image_size);
    if (!a.crop_padding) a.crop_padding = 0;
  }
}

}  // namespace convnn::data
