#include "convnn/data/datasets.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <filesystem>
#include <utility>

#include "util/enum_names.h"

namespace convnn::data {
namespace {

namespace fs = std::filesystem;

constexpr convnn::detail::NameTable<Split, 2> kSplits{{{"train", Split::Train}, {"test", Split::Test}}};

constexpr convnn::detail::NameTable<DatasetKind, 4> kDatasetNames = {{
    {"fashion-mnist", DatasetKind::FashionMnist},
    {"mnist", DatasetKind::Mnist},
    {"cifar10", DatasetKind::Cifar10},
    {"cifar100", DatasetKind::Cifar100},
}};

std::vector<std::string> class_names_of(DatasetKind kind) {
  switch (kind) {
    case DatasetKind::FashionMnist:
      return {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
              "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
    case DatasetKind::Mnist:
      return {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
    case DatasetKind::Cifar10:
      return {"airplane", "automobile", "bird", "cat", "deer",
              "dog",      "frog",       "horse", "ship", "truck"};
    case DatasetKind::Cifar100:
      return {"apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle",
              "bicycle", "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can",
              "castle", "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud",
              "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur", "dolphin",
              "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo",
              "keyboard", "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man",
              "maple_tree", "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange",
              "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain",
              "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road",
              "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail",
              "snake", "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table",
              "tank", "telephone", "television", "tiger", "tractor", "train", "trout", "tulip",
              "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm"};
  }
  TORCH_CHECK(false, "unknown DatasetKind ", static_cast<int>(kind));
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

bool is_idx(DatasetKind kind) {
  return kind == DatasetKind::FashionMnist || kind == DatasetKind::Mnist;
}

// The standard file names of a split (IDX names without their optional .gz).
std::vector<std::string> split_files(DatasetKind kind, Split split) {
  const bool train = split == Split::Train;
  if (is_idx(kind)) {
    const std::string prefix = train ? "train" : "t10k";
    return {prefix + "-images-idx3-ubyte", prefix + "-labels-idx1-ubyte"};
  }
  if (kind == DatasetKind::Cifar100) return {train ? "train.bin" : "test.bin"};
  if (!train) return {"test_batch.bin"};
  std::vector<std::string> names;
  for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
  return names;
}

const char* cifar_subfolder(DatasetKind kind) {
  return kind == DatasetKind::Cifar10 ? "cifar-10-batches-bin" : "cifar-100-binary";
}

void check_root(DatasetKind kind, const std::string& root, Split split) {
  std::error_code ec;
  const bool found = fs::is_directory(root, ec);
  const char* hint = kind == DatasetKind::FashionMnist
                         ? " (Debian: apt-get install dataset-fashion-mnist)"
                         : "";
  TORCH_CHECK(found, to_string(kind), ": data directory ", root, " does not exist", hint,
              "; expected it to hold ", join(split_files(kind, split)),
              is_idx(kind) ? " (each optionally .gz)" : "");
}

// `name` or `name.gz`, whichever exists (the uncompressed one when both do); otherwise an error
// listing every file the split needs.
std::string idx_file(DatasetKind kind, const fs::path& root, const std::string& name,
                     const std::vector<std::string>& needed) {
  for (const auto& candidate : {name, name + ".gz"}) {
    std::error_code ec;
    if (fs::is_regular_file(root / candidate, ec)) return (root / candidate).string();
  }
  TORCH_CHECK(false, to_string(kind), ": missing ", (root / name).string(), "[.gz]; expected ",
              join(needed), " (each optionally .gz) under ", root.string());
}

void check_labels_in_range(const at::Tensor& labels, int64_t num_classes,
                           const std::string& path) {
  const auto* data = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < labels.size(0); ++i) {
    TORCH_CHECK(data[i] >= 0 && data[i] < num_classes, "IDX labels ", path, ": label ", i,
                " is ", data[i], ", out of range [0, ", num_classes, ")");
  }
}

ImageSet load_idx(DatasetKind kind, const fs::path& root, Split split) {
  const auto needed = split_files(kind, split);
  const auto images_path = idx_file(kind, root, needed[0], needed);
  const auto labels_path = idx_file(kind, root, needed[1], needed);
  ImageSet set;
  set.images = read_idx_images(images_path);
  set.labels = read_idx_labels(labels_path);
  set.class_names = class_names_of(kind);
  TORCH_CHECK(set.images.size(0) == set.labels.size(0), to_string(kind), ": ", images_path,
              " holds ", set.images.size(0), " images but ", labels_path, " holds ",
              set.labels.size(0), " labels");
  check_labels_in_range(set.labels, set.num_classes(), labels_path);
  return set;
}

// The files directly under `root`, or under the archive's own folder when it was unpacked there.
std::vector<std::string> cifar_files(DatasetKind kind, const fs::path& root,
                                     const std::string& subfolder,
                                     const std::vector<std::string>& names) {
  std::vector<std::string> missing_in_root;
  for (const auto& dir : {root, root / subfolder}) {
    std::vector<std::string> paths, missing;
    for (const auto& name : names) {
      std::error_code ec;
      if (fs::is_regular_file(dir / name, ec)) {
        paths.push_back((dir / name).string());
      } else {
        missing.push_back(name);
      }
    }
    if (missing.empty()) return paths;
    if (dir == root) missing_in_root = missing;
  }
  TORCH_CHECK(false, to_string(kind), ": missing ", join(missing_in_root), " under ",
              root.string(), "; expected ", join(names), " there or under ",
              (root / subfolder).string());
}

ImageSet load_cifar(DatasetKind kind, const fs::path& root, Split split) {
  const auto files = cifar_files(kind, root, cifar_subfolder(kind), split_files(kind, split));
  const int64_t label_bytes = kind == DatasetKind::Cifar100 ? 2 : 1;
  return read_cifar(files, label_bytes, class_names_of(kind));
}

}  // namespace

DatasetKind parse_dataset(const std::string& name) {
  return convnn::detail::parse_name(kDatasetNames, name, "dataset");
}

std::string to_string(DatasetKind kind) { return convnn::detail::name_of(kDatasetNames, kind); }

const std::vector<std::string>& dataset_names() { return convnn::detail::table_names<kDatasetNames>(); }

Split parse_split(const std::string& name) { return convnn::detail::parse_name(kSplits, name, "split"); }
std::string to_string(Split split) { return convnn::detail::name_of(kSplits, split); }
const std::vector<std::string>& split_names() { return convnn::detail::table_names<kSplits>(); }

std::string default_data_dir(DatasetKind kind) {
  if (kind == DatasetKind::FashionMnist) return "/usr/share/datasets/fashion-mnist";
  return "data/" + to_string(kind);
}

ImageSet load_dataset(DatasetKind kind, const std::string& root, Split split) {
  check_root(kind, root, split);
  return is_idx(kind) ? load_idx(kind, root, split) : load_cifar(kind, root, split);
}

Normalisation normalisation_of(DatasetKind kind) {
  switch (kind) {
    case DatasetKind::FashionMnist:
      return {{0.2860}, {0.3530}};
    case DatasetKind::Mnist:
      return {{0.1307}, {0.3081}};
    case DatasetKind::Cifar10:
      return {{0.4914, 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616}};
    case DatasetKind::Cifar100:
      return {{0.5071, 0.4865, 0.4409}, {0.2673, 0.2564, 0.2762}};
  }
  TORCH_CHECK(false, "unknown DatasetKind ", static_cast<int>(kind));
}

}  // namespace convnn::data
