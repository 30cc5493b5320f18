#pragma once
// Labelled image sets held in memory as uint8, read from their standard binary formats:
// Fashion-MNIST / MNIST (IDX, gzipped or not) and CIFAR-10 / CIFAR-100 (binary version).
// Every reader checks sizes and headers and throws c10::Error naming the file: nothing loads half
// a data set silently.
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace convnn::data {

enum class DatasetKind { FashionMnist, Mnist, Cifar10, Cifar100 };
enum class Split { Train, Test };

/// fashion-mnist, mnist, cifar10, cifar100.
DatasetKind parse_dataset(const std::string& name);
std::string to_string(DatasetKind kind);
const std::vector<std::string>& dataset_names();
/// train, test (the val/ folder of an image folder).
Split parse_split(const std::string& name);
std::string to_string(Split split);
const std::vector<std::string>& split_names();

/// images uint8 [N,C,H,W] contiguous, labels int64 [N] in [0, class_names.size()).
struct ImageSet {
  at::Tensor images;
  at::Tensor labels;
  std::vector<std::string> class_names;

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  int64_t num_classes() const { return static_cast<int64_t>(class_names.size()); }
  int64_t channels() const { return images.size(1); }
  int64_t height() const { return images.size(2); }
  int64_t width() const { return images.size(3); }
};

/// IDX image file (magic 0x00000803, big-endian sizes), raw or gzip-compressed: uint8 [N,1,H,W].
at::Tensor read_idx_images(const std::string& path);
/// IDX label file (magic 0x00000801): int64 [N].
at::Tensor read_idx_labels(const std::string& path);
/// CIFAR binary files: records of <label byte>[<coarse byte>]<3072 pixel bytes>, concatenated.
/// `fine_labels` selects CIFAR-100's fine label (100 classes) over the coarse one; CIFAR-10 files
/// have one label byte (pass num_label_bytes = 1).
ImageSet read_cifar(const std::vector<std::string>& files, int64_t num_label_bytes,
                    std::vector<std::string> class_names);

/// Where a data set lives when --data-dir is not given: Debian's dataset-fashion-mnist package
/// for Fashion-MNIST (/usr/share/datasets/fashion-mnist); data/<name> for the others.
std::string default_data_dir(DatasetKind kind);
/// One split of a data set from its standard file names under `root`:
///   fashion-mnist, mnist: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
///   cifar10: data_batch_{1..5}.bin / test_batch.bin (also under cifar-10-batches-bin/)
///   cifar100: train.bin / test.bin (also under cifar-100-binary/)
/// A missing file is an error that names the path and the expected names.
ImageSet load_dataset(DatasetKind kind, const std::string& root, Split split);

/// Per-channel mean and standard deviation of the training split, in [0,1] pixel units.
struct Normalisation {
  std::vector<double> mean, std;
};
Normalisation normalisation_of(DatasetKind kind);

}  // namespace convnn::data
