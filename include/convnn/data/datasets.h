#pragma once
// Image classification datasets in their standard binary formats, read whole into memory.
// Every reader validates sizes and headers and names the offending file: nothing loads half a
// dataset silently.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace convnn::data {

struct ImageDataset {
  at::Tensor images;  // uint8 [N, C, H, W]
  at::Tensor labels;  // int64 [N], in [0, num_classes)
  int64_t num_classes = 0;
  std::vector<std::string> class_names;

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

enum class Split { Train, Test };

/// An IDX image file (magic 0x00000803) and label file (0x00000801), gzipped or raw.
ImageDataset read_idx(const std::string& images_path, const std::string& labels_path,
                      int64_t num_classes, std::vector<std::string> class_names);

/// MNIST or Fashion-MNIST from a folder holding {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
ImageDataset load_mnist(const std::string& folder, Split split);
ImageDataset load_fashion_mnist(const std::string& folder, Split split);

/// CIFAR-10 binary version: data_batch_{1..5}.bin / test_batch.bin (+ batches.meta.txt).
ImageDataset load_cifar10(const std::string& folder, Split split);
/// CIFAR-100 binary version: train.bin / test.bin, fine labels (100 classes).
ImageDataset load_cifar100(const std::string& folder, Split split);

/// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* kDebianFashionMnistFolder = "/usr/share/datasets/fashion-mnist";

}  // namespace convnn::data
