// CIFAR-10 / CIFAR-100 binary reader: round trips over several files, and errors naming the file.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/data/datasets.h"
#include "data/fixtures.h"

namespace {

using namespace convnn::data;
using namespace convnn::testing;

std::vector<std::string> names(int n) {
  std::vector<std::string> all;
  for (int i = 0; i < n; ++i) all.push_back("c" + std::to_string(i));
  return all;
}

TEST(CifarReader, RoundTripCifar10TwoFiles) {
  TempDir dir;
  const auto images = random_images({5, 3, 32, 32}, 11);
  const auto labels = torch::tensor({9, 0, 4, 4, 1}, torch::kLong);
  using torch::indexing::Slice;
  write_file(dir.file("a.bin"), cifar_records(images.index({Slice(0, 2)}),
                                              labels.index({Slice(0, 2)})));
  write_file(dir.file("b.bin"), cifar_records(images.index({Slice(2, 5)}),
                                              labels.index({Slice(2, 5)})));
  const auto set = read_cifar({dir.file("a.bin"), dir.file("b.bin")}, 1, names(10));
  EXPECT_EQ(set.size(), 5);
  EXPECT_EQ(set.channels(), 3);
  EXPECT_EQ(set.height(), 32);
  EXPECT_EQ(set.width(), 32);
  EXPECT_EQ(set.num_classes(), 10);
  EXPECT_TRUE(torch::equal(set.images, images));
  EXPECT_TRUE(torch::equal(set.labels, labels));
}

TEST(CifarReader, RoundTripCifar100FineLabels) {
  TempDir dir;
  const auto images = random_images({3, 3, 32, 32}, 12);
  const auto fine = torch::tensor({99, 0, 42}, torch::kLong);
  const auto coarse = torch::tensor({19, 3, 0}, torch::kLong);
  write_file(dir.file("train.bin"), cifar_records(images, fine, coarse));
  const auto set = read_cifar({dir.file("train.bin")}, 2, names(100));
  EXPECT_TRUE(torch::equal(set.images, images));
  EXPECT_TRUE(torch::equal(set.labels, fine));
}

TEST(CifarReader, SizeNotAMultipleOfTheRecord) {
  TempDir dir;
  auto bytes = cifar_records(random_images({2, 3, 32, 32}, 13), torch::tensor({1, 2}));
  bytes.pop_back();
  write_file(dir.file("cut.bin"), bytes);
  expect_error([&] { read_cifar({dir.file("cut.bin")}, 1, names(10)); }, dir.file("cut.bin"),
               "not a multiple of the record size 3073");
  // CIFAR-100 records are one byte longer: a CIFAR-10 file read as CIFAR-100 fails the same way.
  write_file(dir.file("ten.bin"),
             cifar_records(random_images({2, 3, 32, 32}, 13), torch::tensor({1, 2})));
  expect_error([&] { read_cifar({dir.file("ten.bin")}, 2, names(100)); }, dir.file("ten.bin"),
               "record size 3074");
}

TEST(CifarReader, EmptyAndMissingFiles) {
  TempDir dir;
  write_file(dir.file("empty.bin"), {});
  expect_error([&] { read_cifar({dir.file("empty.bin")}, 1, names(10)); },
               dir.file("empty.bin"), "empty");
  expect_error([&] { read_cifar({dir.file("absent.bin")}, 1, names(10)); },
               dir.file("absent.bin"), "no such file");
  EXPECT_NE(error_of([] { read_cifar({}, 1, names(10)); }).find("no files"), std::string::npos);
}

TEST(CifarReader, LabelOutOfRange) {
  TempDir dir;
  write_file(dir.file("ok.bin"), cifar_records(random_images({1, 3, 32, 32}, 14),
                                               torch::tensor({3})));
  write_file(dir.file("bad.bin"), cifar_records(random_images({3, 3, 32, 32}, 14),
                                                torch::tensor({3, 1, 10})));
  // The good first file is not returned alone: the whole read fails.
  expect_error([&] { read_cifar({dir.file("ok.bin"), dir.file("bad.bin")}, 1, names(10)); },
               dir.file("bad.bin"), "record 2 has label 10, out of range [0, 10)");
  write_file(dir.file("coarse.bin"), cifar_records(random_images({1, 3, 32, 32}, 14),
                                                   torch::tensor({5}), torch::tensor({20})));
  expect_error([&] { read_cifar({dir.file("coarse.bin")}, 2, names(100)); },
               dir.file("coarse.bin"), "coarse label 20");
}

// No CIFAR file holds more than all of CIFAR (60,000 records): a gzip file inflating beyond is
// refused there. The bomb's trailer is wrong on purpose, so a reader that inflated it to the end
// would report damaged gzip data instead: the message proves where reading stopped.
TEST(CifarReader, FileLargerThanAllOfCifarIsRefusedWhereItPassesTheBound) {
  TempDir dir;
  const uint64_t records = 60001, record = 1 + 3 * 32 * 32;
  write_file(dir.file("data_batch_1.bin.gz"), gzip_bomb({}, records * record));
  expect_error([&] { read_cifar({dir.file("data_batch_1.bin.gz")}, 1, names(10)); },
               dir.file("data_batch_1.bin.gz"),
               "holds more than 184380000 bytes (60000 records of 3073 bytes, all of CIFAR's images in "
               "one file); reading stopped there");
}

TEST(CifarReader, BadArguments) {
  TempDir dir;
  write_file(dir.file("a.bin"), cifar_records(random_images({1, 3, 32, 32}, 15),
                                              torch::tensor({0})));
  EXPECT_NE(error_of([&] { read_cifar({dir.file("a.bin")}, 3, names(10)); })
                .find("num_label_bytes must be 1 (CIFAR-10) or 2 (CIFAR-100), got 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_cifar({dir.file("a.bin")}, 1, {}); }).find("class_names"),
            std::string::npos);
}

}  // namespace
