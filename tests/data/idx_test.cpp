// IDX reader: raw and gzip round trips, and every corruption is an error naming the file.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "convnn/data/datasets.h"
#include "data/fixtures.h"

namespace {

using namespace convnn::data;
using namespace convnn::testing;

TEST(IdxReader, RoundTripRaw) {
  TempDir dir;
  const auto images = random_images({7, 1, 5, 4}, 1);
  const auto labels = torch::tensor({3, 0, 9, 255, 1, 2, 7}, torch::kLong);
  write_file(dir.file("images"), idx_images(images));
  write_file(dir.file("labels"), idx_labels(labels));
  const auto read_images = read_idx_images(dir.file("images"));
  const auto read_labels = read_idx_labels(dir.file("labels"));
  EXPECT_EQ(read_images.sizes(), images.sizes());
  EXPECT_EQ(read_images.scalar_type(), torch::kByte);
  EXPECT_TRUE(read_images.is_contiguous());
  EXPECT_TRUE(torch::equal(read_images, images));
  EXPECT_EQ(read_labels.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(read_labels, labels));
}

// Larger than one stored deflate block (64 KiB), so the stream has several.
TEST(IdxReader, RoundTripGzip) {
  TempDir dir;
  const auto images = random_images({100, 1, 28, 28}, 2);
  const auto labels = torch::arange(100, torch::kLong) % 10;
  write_file(dir.file("images.gz"), gzip_stored(idx_images(images)));
  write_file(dir.file("labels.gz"), gzip_stored(idx_labels(labels)));
  EXPECT_TRUE(torch::equal(read_idx_images(dir.file("images.gz")), images));
  EXPECT_TRUE(torch::equal(read_idx_labels(dir.file("labels.gz")), labels));
}

TEST(IdxReader, MissingFile) {
  TempDir dir;
  expect_error([&] { read_idx_images(dir.file("absent")); }, dir.file("absent"), "no such file");
  expect_error([&] { read_idx_labels(dir.path().string()); }, dir.path().string(),
               "not a regular file");
}

TEST(IdxReader, EmptyFile) {
  TempDir dir;
  write_file(dir.file("empty"), {});
  expect_error([&] { read_idx_images(dir.file("empty")); }, dir.file("empty"), "empty");
  expect_error([&] { read_idx_labels(dir.file("empty")); }, dir.file("empty"), "empty");
}

TEST(IdxReader, BadMagic) {
  TempDir dir;
  const auto labels = torch::zeros({4}, torch::kLong);
  write_file(dir.file("labels"), idx_labels(labels));
  // A label file where images are expected: the message says what it found.
  expect_error([&] { read_idx_images(dir.file("labels")); }, dir.file("labels"),
               "bad magic number 0x00000801 (an IDX label file), expected 0x00000803");
  write_file(dir.file("images"), idx_images(random_images({2, 1, 3, 3}, 3)));
  expect_error([&] { read_idx_labels(dir.file("images")); }, dir.file("images"), "bad magic");
  // Compressed twice: the content after one gunzip still starts with the gzip magic.
  write_file(dir.file("twice.gz"), gzip_stored(gzip_stored(idx_labels(labels))));
  expect_error([&] { read_idx_labels(dir.file("twice.gz")); }, dir.file("twice.gz"),
               "compressed twice");
}

TEST(IdxReader, TruncatedHeader) {
  TempDir dir;
  auto bytes = idx_images(random_images({2, 1, 3, 3}, 4));
  bytes.resize(10);
  write_file(dir.file("images"), bytes);
  expect_error([&] { read_idx_images(dir.file("images")); }, dir.file("images"),
               "truncated header");
}

TEST(IdxReader, TruncatedData) {
  TempDir dir;
  auto images = idx_images(random_images({5, 1, 4, 4}, 5));
  images.pop_back();
  write_file(dir.file("images"), images);
  expect_error([&] { read_idx_images(dir.file("images")); }, dir.file("images"),
               "truncated: the header promises 5 images of 4x4 (80 bytes), the file holds 79");
  auto labels = idx_labels(torch::zeros({6}, torch::kLong));
  labels.resize(labels.size() - 2);
  write_file(dir.file("labels.gz"), gzip_stored(labels));
  expect_error([&] { read_idx_labels(dir.file("labels.gz")); }, dir.file("labels.gz"),
               "truncated");
}

// A gzip stream cut short (no trailer, last block incomplete) must not pass as a short file.
TEST(IdxReader, TruncatedGzipStream) {
  TempDir dir;
  auto gz = gzip_stored(idx_images(random_images({100, 1, 28, 28}, 6)));
  gz.resize(gz.size() / 2);
  write_file(dir.file("images.gz"), gz);
  expect_error([&] { read_idx_images(dir.file("images.gz")); }, dir.file("images.gz"),
               "truncated");
}

TEST(IdxReader, DamagedGzipStream) {
  TempDir dir;
  auto gz = gzip_stored(idx_labels(torch::zeros({50}, torch::kLong)));
  gz[gz.size() - 6] ^= 0xff;  // the CRC
  write_file(dir.file("labels.gz"), gz);
  expect_error([&] { read_idx_labels(dir.file("labels.gz")); }, dir.file("labels.gz"), "gzip");
}

TEST(IdxReader, TrailingBytes) {
  TempDir dir;
  auto images = idx_images(random_images({2, 1, 3, 3}, 7));
  images.insert(images.end(), {1, 2, 3});
  write_file(dir.file("images"), images);
  expect_error([&] { read_idx_images(dir.file("images")); }, dir.file("images"),
               "3 trailing bytes");
  auto labels = idx_labels(torch::zeros({3}, torch::kLong));
  labels.push_back(0);
  write_file(dir.file("labels.gz"), gzip_stored(labels));
  expect_error([&] { read_idx_labels(dir.file("labels.gz")); }, dir.file("labels.gz"),
               "1 trailing bytes");
}

TEST(IdxReader, ZeroSizes) {
  TempDir dir;
  write_file(dir.file("images"), idx_images(torch::zeros({0, 1, 3, 3}, torch::kByte)));
  expect_error([&] { read_idx_images(dir.file("images")); }, dir.file("images"),
               "declares 0 images");
  write_file(dir.file("labels"), idx_labels(torch::zeros({0}, torch::kLong)));
  expect_error([&] { read_idx_labels(dir.file("labels")); }, dir.file("labels"),
               "declares 0 labels");
}

// An IDX header promising 10 images of 28x28 (7,840 bytes) followed by 64 MiB of zeros, as a
// 420 KB gzip file: the reader inflates what the header promises plus a few KB, then refuses the
// rest. The bomb's trailer is wrong on purpose, so a reader that inflated all 64 MiB would report
// damaged gzip data, not trailing data: the message proves where reading stopped.
TEST(IdxReader, GzipBombIsRefusedAfterInflatingOnlyWhatTheHeaderPromises) {
  TempDir dir;
  const Bytes header = {0, 0, 8, 3, 0, 0, 0, 10, 0, 0, 0, 28, 0, 0, 0, 28};
  const auto bomb = gzip_bomb(header, uint64_t{64} << 20);
  EXPECT_LT(bomb.size(), size_t{1} << 20);
  write_file(dir.file("train-images-idx3-ubyte.gz"), bomb);
  const auto message = error_of([&] { read_idx_images(dir.file("train-images-idx3-ubyte.gz")); });
  EXPECT_NE(message.find(dir.file("train-images-idx3-ubyte.gz")), std::string::npos) << message;
  EXPECT_NE(message.find("trailing data: 4096 bytes or more after the 10 images of 28x28 (7840 "
                         "bytes) the header promises; reading stopped there"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("damaged"), std::string::npos) << message;
  // The same for labels: 5 promised, 64 MiB given.
  write_file(dir.file("labels.gz"), gzip_bomb({0, 0, 8, 1, 0, 0, 0, 5}, uint64_t{64} << 20));
  expect_error([&] { read_idx_labels(dir.file("labels.gz")); }, dir.file("labels.gz"),
               "trailing data: 4096 bytes or more after the 5 labels");
}

// A header may claim any size: the buffer grows with the data that comes, never to the size
// claimed, so a 16-byte file claiming a billion 28x28 images (784 GB) is truncated, not an
// allocation failure.
TEST(IdxReader, HeaderClaimingTerabytesIsTruncatedWithoutAllocatingTheClaim) {
  TempDir dir;
  write_file(dir.file("images"), {0, 0, 8, 3, 0x3b, 0x9a, 0xca, 0x00, 0, 0, 0, 28, 0, 0, 0, 28});
  expect_error([&] { read_idx_images(dir.file("images")); }, dir.file("images"),
               "truncated: the header promises 1000000000 images of 28x28 (784000000000 bytes), "
               "the file holds 0 bytes");
}

}  // namespace
