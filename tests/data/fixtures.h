#pragma once
// Small data set files written by the tests themselves: IDX (raw or gzip) and CIFAR binaries in a
// temporary directory, plus a helper to capture c10::Error messages.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "support/error_message.h"

namespace convnn::testing {

using Bytes = std::vector<uint8_t>;

/// A fresh directory under the system temp directory, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  /// path() / name as a string.
  std::string file(const std::string& name) const;

 private:
  std::filesystem::path path_;
};

void write_file(const std::string& path, const Bytes& bytes);

/// A valid gzip stream of `data` made of stored (uncompressed) deflate blocks: the test binary
/// does not link zlib, and a hand-made stream also checks the reader against the format itself.
Bytes gzip_stored(const Bytes& data);

/// IDX files: images uint8 [N,1,H,W] (or [N,H,W]), labels any integer [N] in [0, 256).
Bytes idx_images(const at::Tensor& images);
Bytes idx_labels(const at::Tensor& labels);
/// CIFAR records: images uint8 [N,3,32,32]; labels int [N]; coarse labels only for CIFAR-100.
Bytes cifar_records(const at::Tensor& images, const at::Tensor& labels,
                    const at::Tensor& coarse = {});

/// Random uint8 images of the given shape, from a seeded generator.
at::Tensor random_images(at::IntArrayRef shape, uint64_t seed);

/// A PNG written by hand: stored (uncompressed) deflate blocks, filter type 0 on every row, no
/// interlace. It reaches what our encoder never writes (palettes with transparency, 16-bit
/// samples, 1-bit gray, gray + alpha), independently of libpng, which the test binary does not
/// link. `rows` holds the samples of each row as PNG stores them: packed when below 8 bits,
/// big-endian when 16.
struct PngSpec {
  uint32_t width = 0;
  uint32_t height = 0;
  uint8_t bit_depth = 8;
  uint8_t color_type = 2;  // 0 gray, 2 RGB, 3 palette, 4 gray + alpha, 6 RGBA
  Bytes rows;              // height * ceil(width * samples * bit_depth / 8) bytes
  Bytes palette;           // PLTE: 3 bytes a colour (color_type 3 only)
  Bytes transparency;      // tRNS, written when not empty
};
Bytes png_by_hand(const PngSpec& spec);

/// A PNG of about 100 bytes whose header claims width x height 8-bit RGB pixels: signature, IHDR
/// (valid CRC), an IDAT of a few bytes that holds none of them, IEND. A decoder that allocates
/// the image its header claims before reading the data runs out of memory on it.
Bytes png_claiming(uint32_t width, uint32_t height);

/// A gzip bomb: `prefix` then `zeros` zero bytes, deflated as fixed-Huffman matches of 258 bytes
/// (about 160:1; 64 MiB of zeros take 420 KB), written by hand like gzip_stored. Its trailer is
/// deliberately wrong (CRC-32 and length 0): a reader that inflates it to the end reports
/// damaged data there, one that stops early never sees it.
Bytes gzip_bomb(const Bytes& prefix, uint64_t zeros);

/// EXPECTs that `f` throws a c10::Error whose message holds both `path` and `what`.
void expect_error(const std::function<void()>& f, const std::string& path,
                  const std::string& what);

}  // namespace convnn::testing

// Images for the transform tests (tests/data/transforms_test.cpp, rand_augment_test.cpp).
#include "convnn/data/image.h"

namespace convnn::testing {

/// A uint8 HWC image of uniformly random bytes from a seeded generator.
data::Image random_image(int64_t height, int64_t width, uint64_t seed, int64_t channels = 3);
/// The image as a uint8 [H, W, C] tensor (a copy), for comparisons with ATen.
at::Tensor image_tensor(const data::Image& image);

}  // namespace convnn::testing

// ImageNet-style folders for the image loader and training tests (tests/data/image_loader_test.cpp,
// tests/train/imagefolder_train_test.cpp).
namespace convnn::testing {

struct ImageFolderSpec {
  int64_t classes = 3;
  int64_t train_per_class = 4;
  int64_t val_per_class = 2;
  int64_t height = 30, width = 40;
  bool flat_val = false;  // val/ without class folders, labelled by root/val_labels.txt
};
/// Writes root/train/c<k>/ and root/val/ (class folders, or flat with val_labels.txt): small
/// images tinted by class plus noise, every third one a PNG, the others JPEGs (quality 90).
void write_image_folder(const std::string& root, const ImageFolderSpec& spec = {});
/// Replaces `path` with bytes that are no image at all.
void write_garbage(const std::string& path);
/// Cuts `path` to half its size.
void truncate_half(const std::string& path);

}  // namespace convnn::testing
