// Data set names, normalisation constants, load_dataset over fixture directories (file names,
// .gz or not, CIFAR subfolders, cross-file checks) and the real Fashion-MNIST test split.
#include "convnn/data/datasets.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "data/fixtures.h"

namespace {

using namespace convnn::data;
using namespace convnn::testing;

TEST(Datasets, NamesRoundTrip) {
  EXPECT_EQ(dataset_names(),
            (std::vector<std::string>{"fashion-mnist", "mnist", "cifar10", "cifar100"}));
  for (const auto& name : dataset_names()) EXPECT_EQ(to_string(parse_dataset(name)), name);
  const auto message = error_of([] { parse_dataset("imagenet"); });
  EXPECT_NE(message.find("fashion-mnist, mnist, cifar10, cifar100"), std::string::npos)
      << message;
  EXPECT_NE(message.find("imagenet"), std::string::npos) << message;
}

TEST(Datasets, DefaultDataDir) {
  EXPECT_EQ(default_data_dir(DatasetKind::FashionMnist), "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(default_data_dir(DatasetKind::Mnist), "data/mnist");
  EXPECT_EQ(default_data_dir(DatasetKind::Cifar10), "data/cifar10");
  EXPECT_EQ(default_data_dir(DatasetKind::Cifar100), "data/cifar100");
}

TEST(Datasets, Normalisation) {
  const auto fashion = normalisation_of(DatasetKind::FashionMnist);
  EXPECT_EQ(fashion.mean, std::vector<double>{0.2860});
  EXPECT_EQ(fashion.std, std::vector<double>{0.3530});
  EXPECT_EQ(normalisation_of(DatasetKind::Mnist).mean, std::vector<double>{0.1307});
  const auto c10 = normalisation_of(DatasetKind::Cifar10);
  EXPECT_EQ(c10.mean, (std::vector<double>{0.4914, 0.4822, 0.4465}));
  EXPECT_EQ(c10.std, (std::vector<double>{0.2470, 0.2435, 0.2616}));
  const auto c100 = normalisation_of(DatasetKind::Cifar100);
  EXPECT_EQ(c100.mean, (std::vector<double>{0.5071, 0.4865, 0.4409}));
  EXPECT_EQ(c100.std, (std::vector<double>{0.2673, 0.2564, 0.2762}));
}

// Writes an IDX split; `gz` picks the compressed file names.
void write_idx_split(const TempDir& dir, const std::string& prefix, const at::Tensor& images,
                     const at::Tensor& labels, bool gz) {
  const std::string suffix = gz ? ".gz" : "";
  auto encode = [&](Bytes bytes) { return gz ? gzip_stored(bytes) : bytes; };
  write_file(dir.file(prefix + "-images-idx3-ubyte" + suffix), encode(idx_images(images)));
  write_file(dir.file(prefix + "-labels-idx1-ubyte" + suffix), encode(idx_labels(labels)));
}

TEST(Datasets, LoadIdxRawAndGzip) {
  TempDir dir;
  const auto train = random_images({6, 1, 28, 28}, 21);
  const auto test = random_images({4, 1, 28, 28}, 22);
  write_idx_split(dir, "train", train, torch::tensor({0, 1, 2, 3, 4, 9}), false);
  write_idx_split(dir, "t10k", test, torch::tensor({5, 6, 7, 8}), true);
  // With both names present the uncompressed file is read: this .gz would fail.
  write_file(dir.file("train-images-idx3-ubyte.gz"), {1, 2, 3});
  const auto root = dir.path().string();
  const auto train_set = load_dataset(DatasetKind::FashionMnist, root, Split::Train);
  EXPECT_TRUE(torch::equal(train_set.images, train));
  EXPECT_TRUE(torch::equal(train_set.labels, torch::tensor({0, 1, 2, 3, 4, 9}, torch::kLong)));
  EXPECT_EQ(train_set.class_names.front(), "T-shirt/top");
  EXPECT_EQ(train_set.class_names.back(), "Ankle boot");
  const auto test_set = load_dataset(DatasetKind::Mnist, root, Split::Test);
  EXPECT_TRUE(torch::equal(test_set.images, test));
  EXPECT_EQ(test_set.class_names,
            (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}));
}

TEST(Datasets, LoadIdxMissingFile) {
  TempDir dir;
  write_file(dir.file("t10k-images-idx3-ubyte.gz"),
             gzip_stored(idx_images(random_images({2, 1, 28, 28}, 23))));
  const auto message =
      error_of([&] { load_dataset(DatasetKind::FashionMnist, dir.path().string(), Split::Test); });
  EXPECT_NE(message.find(dir.file("t10k-labels-idx1-ubyte")), std::string::npos) << message;
  EXPECT_NE(message.find("t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte"), std::string::npos)
      << message;
  expect_error([&] { load_dataset(DatasetKind::Mnist, dir.file("nowhere"), Split::Train); },
               dir.file("nowhere"),
               "does not exist; expected it to hold train-images-idx3-ubyte, "
               "train-labels-idx1-ubyte (each optionally .gz)");
}

TEST(Datasets, LoadIdxCountMismatch) {
  TempDir dir;
  write_idx_split(dir, "train", random_images({3, 1, 28, 28}, 24), torch::tensor({0, 1}), false);
  const auto message =
      error_of([&] { load_dataset(DatasetKind::Mnist, dir.path().string(), Split::Train); });
  EXPECT_NE(message.find(dir.file("train-images-idx3-ubyte") + " holds 3 images but " +
                         dir.file("train-labels-idx1-ubyte") + " holds 2 labels"),
            std::string::npos)
      << message;
}

TEST(Datasets, LoadIdxLabelOutOfRange) {
  TempDir dir;
  write_idx_split(dir, "train", random_images({3, 1, 28, 28}, 25), torch::tensor({0, 10, 1}),
                  true);
  expect_error([&] { load_dataset(DatasetKind::Mnist, dir.path().string(), Split::Train); },
               dir.file("train-labels-idx1-ubyte.gz"), "label 1 is 10, out of range [0, 10)");
}

TEST(Datasets, LoadCifar10FromSubfolder) {
  TempDir dir;
  std::vector<at::Tensor> parts;
  for (int i = 1; i <= 5; ++i) {
    parts.push_back(random_images({2, 3, 32, 32}, 30 + i));
    write_file(dir.file("cifar-10-batches-bin/data_batch_" + std::to_string(i) + ".bin"),
               cifar_records(parts.back(), torch::tensor({i, 9})));
  }
  const auto set = load_dataset(DatasetKind::Cifar10, dir.path().string(), Split::Train);
  EXPECT_TRUE(torch::equal(set.images, torch::cat(parts)));
  EXPECT_TRUE(torch::equal(set.labels,
                           torch::tensor({1, 9, 2, 9, 3, 9, 4, 9, 5, 9}, torch::kLong)));
  EXPECT_EQ(set.class_names.size(), 10u);
  EXPECT_EQ(set.class_names[0], "airplane");
  EXPECT_EQ(set.class_names[9], "truck");
  // The test batch is missing: the message names it and the expected places.
  const auto message =
      error_of([&] { load_dataset(DatasetKind::Cifar10, dir.path().string(), Split::Test); });
  EXPECT_NE(message.find("missing test_batch.bin"), std::string::npos) << message;
  EXPECT_NE(message.find(dir.file("cifar-10-batches-bin")), std::string::npos) << message;
}

TEST(Datasets, LoadCifar100FromRoot) {
  TempDir dir;
  const auto images = random_images({4, 3, 32, 32}, 40);
  write_file(dir.file("test.bin"), cifar_records(images, torch::tensor({0, 99, 50, 7}),
                                                 torch::tensor({4, 19, 0, 1})));
  const auto set = load_dataset(DatasetKind::Cifar100, dir.path().string(), Split::Test);
  EXPECT_TRUE(torch::equal(set.images, images));
  EXPECT_TRUE(torch::equal(set.labels, torch::tensor({0, 99, 50, 7}, torch::kLong)));
  ASSERT_EQ(set.class_names.size(), 100u);
  EXPECT_EQ(set.class_names.front(), "apple");
  EXPECT_EQ(set.class_names.back(), "worm");
  EXPECT_TRUE(std::is_sorted(set.class_names.begin(), set.class_names.end()));
  EXPECT_EQ(std::adjacent_find(set.class_names.begin(), set.class_names.end()),
            set.class_names.end());
}

TEST(Datasets, RealFashionMnistTestSplit) {
  const std::string root = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::is_directory(root)) GTEST_SKIP() << root << " is not installed";
  const auto set = load_dataset(DatasetKind::FashionMnist, root, Split::Test);
  EXPECT_EQ(set.images.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(set.labels.sizes(), (std::vector<int64_t>{10000}));
  EXPECT_EQ(set.num_classes(), 10);
  EXPECT_GE(set.labels.min().item<int64_t>(), 0);
  EXPECT_LT(set.labels.max().item<int64_t>(), 10);
  EXPECT_TRUE(torch::equal(torch::bincount(set.labels), torch::full({10}, 1000, torch::kLong)));
}

}  // namespace
