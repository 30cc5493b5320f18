#include "convnn/data/datasets.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>

#include "data/file_bytes.h"

namespace convnn::data {
namespace {

uint32_t big_endian_u32(const std::vector<uint8_t>& bytes, size_t offset) {
  return (uint32_t{bytes[offset]} << 24) | (uint32_t{bytes[offset + 1]} << 16) |
         (uint32_t{bytes[offset + 2]} << 8) | uint32_t{bytes[offset + 3]};
}

// The IDX header: magic (0, 0, type 0x08 = ubyte, rank) then `rank` big-endian sizes.
std::vector<int64_t> idx_shape(const std::vector<uint8_t>& bytes, uint32_t rank, const std::string& path) {
  TORCH_CHECK(bytes.size() >= 4 + 4 * size_t{rank}, "malformed IDX file ", path, ": ", bytes.size(),
              " bytes is shorter than its header");
  const uint32_t magic = big_endian_u32(bytes, 0);
  TORCH_CHECK(magic == (0x0800u | rank), "malformed IDX file ", path, ": magic number 0x", std::hex, magic,
              ", expected 0x", (0x0800u | rank), " (unsigned bytes, rank ", std::dec, rank, ")");
  std::vector<int64_t> shape;
  int64_t expected = 1;
  for (uint32_t d = 0; d < rank; ++d) {
    shape.push_back(big_endian_u32(bytes, 4 + 4 * d));
    expected *= shape.back();
  }
  const size_t header = 4 + 4 * size_t{rank};
  TORCH_CHECK(bytes.size() == header + static_cast<size_t>(expected), "truncated or padded IDX file ", path,
              ": header announces ", expected, " values but the file holds ", bytes.size() - header);
  return shape;
}

at::Tensor tensor_from(const std::vector<uint8_t>& bytes, size_t offset, std::vector<int64_t> shape) {
  auto t = at::empty(shape, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), bytes.data() + offset, static_cast<size_t>(t.numel()));
  return t;
}

void check_labels(const at::Tensor& labels, int64_t num_classes, const std::string& path) {
  if (labels.numel() == 0) return;
  const int64_t max_label = labels.max().item<int64_t>();
  TORCH_CHECK(max_label < num_classes, "malformed label file ", path, ": label ", max_label,
              " is outside [0, ", num_classes, ")");
}

std::string in_folder(const std::string& folder, const std::string& stem) {
  for (const auto& name : {stem + ".gz", stem}) {
    const auto path = (std::filesystem::path(folder) / name).string();
    if (std::filesystem::exists(path)) return path;
  }
  TORCH_CHECK(false, "dataset file not found: ", (std::filesystem::path(folder) / stem).string(),
              "[.gz] (is --data-dir right?)");
}

ImageDataset load_mnist_format(const std::string& folder, Split split, std::vector<std::string> names) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  return read_idx(in_folder(folder, prefix + "-images-idx3-ubyte"), in_folder(folder, prefix + "-labels-idx1-ubyte"),
                  10, std::move(names));
}

// CIFAR binary records: `label_bytes` label bytes (the last one is used) then 3x32x32 pixels.
ImageDataset load_cifar_records(const std::vector<std::string>& paths, int64_t label_bytes, int64_t num_classes,
                                std::vector<std::string> names) {
  constexpr int64_t kPixels = 3 * 32 * 32;
  const int64_t record = label_bytes + kPixels;
  std::vector<at::Tensor> images, labels;
  for (const auto& path : paths) {
    const auto bytes = detail::read_file_bytes(path);
    TORCH_CHECK(!bytes.empty() && bytes.size() % record == 0, "truncated or malformed CIFAR file ", path, ": ",
                bytes.size(), " bytes is not a whole number of ", record, "-byte records");
    const int64_t n = static_cast<int64_t>(bytes.size()) / record;
    const auto raw = tensor_from(bytes, 0, {n, record});
    labels.push_back(raw.select(1, label_bytes - 1).to(at::kLong));
    images.push_back(raw.narrow(1, label_bytes, kPixels).reshape({n, 3, 32, 32}).clone());
    check_labels(labels.back(), num_classes, path);
  }
  return {at::cat(images), at::cat(labels), num_classes, std::move(names)};
}

std::vector<std::string> read_names(const std::string& folder, const std::string& file, int64_t count) {
  std::vector<std::string> names;
  std::ifstream in(std::filesystem::path(folder) / file);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) names.push_back(line);
  }
  if (static_cast<int64_t>(names.size()) != count) {
    names.clear();
    for (int64_t i = 0; i < count; ++i) names.push_back(std::to_string(i));
  }
  return names;
}

}  // namespace

ImageDataset read_idx(const std::string& images_path, const std::string& labels_path, int64_t num_classes,
                      std::vector<std::string> class_names) {
  const auto image_bytes = detail::read_file_bytes(images_path);
  const auto label_bytes = detail::read_file_bytes(labels_path);
  const auto image_shape = idx_shape(image_bytes, 3, images_path);
  const auto label_shape = idx_shape(label_bytes, 1, labels_path);
  TORCH_CHECK(image_shape[0] == label_shape[0], "dataset mismatch: ", images_path, " holds ", image_shape[0],
              " images but ", labels_path, " holds ", label_shape[0], " labels");
  auto images = tensor_from(image_bytes, 16, {image_shape[0], 1, image_shape[1], image_shape[2]});
  auto labels = tensor_from(label_bytes, 8, {label_shape[0]}).to(at::kLong);
  check_labels(labels, num_classes, labels_path);
  return {images, labels, num_classes, std::move(class_names)};
}

ImageDataset load_mnist(const std::string& folder, Split split) {
  return load_mnist_format(folder, split, {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"});
}

ImageDataset load_fashion_mnist(const std::string& folder, Split split) {
  return load_mnist_format(folder, split,
                           {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                            "Sneaker", "Bag", "Ankle boot"});
}

ImageDataset load_cifar10(const std::string& folder, Split split) {
  std::vector<std::string> paths;
  if (split == Split::Train) {
    for (int i = 1; i <= 5; ++i) paths.push_back(in_folder(folder, "data_batch_" + std::to_string(i) + ".bin"));
  } else {
    paths.push_back(in_folder(folder, "test_batch.bin"));
  }
  return load_cifar_records(paths, 1, 10, read_names(folder, "batches.meta.txt", 10));
}

ImageDataset load_cifar100(const std::string& folder, Split split) {
  const auto path = in_folder(folder, split == Split::Train ? "train.bin" : "test.bin");
  return load_cifar_records({path}, 2, 100, read_names(folder, "fine_label_names.txt", 100));
}

}  // namespace convnn::data
