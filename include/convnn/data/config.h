#pragma once
// What a run reads and how it augments it: the data and augmentation sections of a training
// config (train::TrainConfig holds them and their JSON), their rules, and the recipes that fill
// what is left unset.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "convnn/data/image_codec.h"

namespace convnn::data {

/// The augmentation recipe: the paper's (DeiT / Swin through timm: RandAugment, colour jitter,
/// random erasing, MixUp / CutMix) or none (image folders: RandomResizedCrop and flip only).
enum class Recipe { Paper, None };
Recipe parse_recipe(const std::string& name);
std::string to_string(Recipe value);
/// The recipes' names in enum order (the one table parse_recipe and to_string read).
const std::vector<std::string>& recipe_names();

/// The data sets a DataConfig names: dataset_names() (held in memory), "imagefolder"
/// (ImageNet-style folders of JPEG / PNG files, decoded per sample) and the text sets of
/// text_dataset_names() ("fortunes", for language models; text.h).
const std::vector<std::string>& config_dataset_names();

/// The crop side of an image folder when image_size is unset.
inline constexpr int64_t kDefaultFolderImageSize = 224;

/// What a run reads, and how its loader reads it.
struct DataConfig {
  std::string dataset = "fashion-mnist";  // or imagefolder, or fortunes (text)
  std::string data_dir;  // empty: default_data_dir; imagefolder: the root of train/, val/; text: its files
  std::string val_labels;                 // imagefolder: labels file of a flat val/ (empty: found beside it)
  bool strict_data = false;               // imagefolder: stop at the first unreadable file (default: skip it)
  // imagefolder: an image whose header claims more pixels (width x height) is unreadable (skipped,
  // or fatal with strict_data); default: PIL's refusal threshold, see kDefaultMaxImagePixels.
  int64_t max_image_pixels = kDefaultMaxImagePixels;
  std::optional<int64_t> image_size;      // imagefolder: side of the crops; unset: 224 (others: their own)
  std::optional<int64_t> val_resize;  // imagefolder: shorter side before the centre crop; unset: size / 0.875
  // Train on the first n samples of a seeded shuffle (text: n windows per epoch); 0: all.
  int64_t train_subset = 0;
  // Evaluate on the first n test samples of a seeded shuffle (text: windows); 0: all.
  int64_t val_subset = 0;
  int64_t workers = 2;                // loader threads
  int64_t prefetch = 4;               // batches held ready
};

/// The per-sample augmentation. Unset values are the recipe's (paper / none) or the data set's;
/// apply_recipe (and, for crop_padding, the loaded images' size) fills them, so that a run's
/// config.json says what it used. Image folders take every field but crop_padding; the in-memory
/// sets take crop_padding, hflip and MixUp / CutMix.
struct AugmentationConfig {
  std::optional<int64_t>
      crop_padding;              // random crop from the zero-padded image; unset: 4 for 32 px, 2 for 28
  std::optional<double> hflip;   // flip probability; unset: 0.5, but 0 for MNIST digits
  std::optional<Recipe> recipe;  // unset: paper for imagefolder, none for the others
  double scale_min = 0.08, scale_max = 1.0;             // RandomResizedCrop area fraction
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // RandomResizedCrop aspect ratio
  std::optional<double> rand_augment;                   // RandAugment magnitude M (paper 9); 0: off
  int64_t rand_augment_ops = 2;                         // RandAugment ops per image; 0: off
  double rand_augment_mstd = 0.5;                       // RandAugment magnitude std; > 100: uniform in [0, M]
  std::optional<double> color_jitter;  // brightness = contrast = saturation strength (paper 0.4)
  std::optional<double> reprob;        // random erasing probability (paper 0.25)
  std::optional<double> mixup;         // MixUp alpha (paper 0.8); 0: off
  std::optional<double> cutmix;        // CutMix alpha (paper 1.0); 0: off
  double mixup_switch_prob = 0.5;      // CutMix instead of MixUp when both are on
};

bool is_image_folder(const DataConfig& config);

/// Checks every value of both sections, then the options that apply to one kind of data set
/// only (errors with the other rather than ignored): c10::Error naming the option, its value and
/// the rule.
void validate(const DataConfig& data, const AugmentationConfig& augmentation);

/// The recipe's values for every unset augmentation field, the recipe itself when unset, the
/// flip probability, and for imagefolder the image size, validation resize and crop padding (0):
/// everything that does not need the data. Idempotent.
void apply_recipe(DataConfig& data, AugmentationConfig& augmentation);

}  // namespace convnn::data
