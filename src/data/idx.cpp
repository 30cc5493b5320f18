// IDX files (http://yann.lecun.com/exdb/mnist/): a big-endian header of a magic number and one
// 32-bit size per dimension, then the unsigned bytes.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <limits>

#include "convnn/data/datasets.h"
#include "data/file_bytes.h"

namespace convnn::data {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension

uint32_t big_endian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

const char* kind_of_magic(uint32_t magic) {
  if (magic == kImagesMagic) return " (an IDX image file)";
  if (magic == kLabelsMagic) return " (an IDX label file)";
  if ((magic >> 16) == 0x1f8b) return " (gzip data: a file compressed twice?)";
  return "";
}

// A file is read in two bounded steps (read_header, read_payload): the header, then at most the
// payload its sizes promise plus kTrailingProbe bytes, so a gzip file that inflates to gigabytes
// (a decompression bomb) is inflated only that far.

// Bytes read past the promised payload: enough to count a few stray bytes exactly, few enough
// that a file inflating to gigabytes costs nothing more.
constexpr int64_t kTrailingProbe = 4096;

// The header's sizes, after checking the magic number and that the header is complete.
std::vector<int64_t> read_header(detail::FileReader& file, std::vector<uint8_t>& bytes,
                                 const std::string& path, const char* what, uint32_t magic,
                                 size_t dims) {
  const size_t header = 4 * (1 + dims);
  file.read(bytes, 4);
  TORCH_CHECK(!bytes.empty(), what, " ", path, ": file is empty");
  // The magic number first: a file of the wrong kind should say so, not that it is short.
  TORCH_CHECK(bytes.size() >= 4, what, " ", path, ": truncated header (", bytes.size(),
              " bytes, expected ", header, ")");
  const uint32_t found = big_endian32(bytes.data());
  TORCH_CHECK(found == magic, what, " ", path, ": bad magic number ", detail::hex32(found),
              kind_of_magic(found), ", expected ", detail::hex32(magic));
  file.read(bytes, header - 4);
  TORCH_CHECK(bytes.size() >= header, what, " ", path, ": truncated header (", bytes.size(),
              " bytes, expected ", header, ")");
  std::vector<int64_t> sizes;
  for (size_t d = 0; d < dims; ++d) sizes.push_back(big_endian32(bytes.data() + 4 * (d + 1)));
  return sizes;
}

// Reads the payload that `expected` says, and kTrailingProbe bytes more at most. It must be
// exactly what the header promises: a shorter file is truncated, a longer one is not the file its
// header describes.
void read_payload(detail::FileReader& file, std::vector<uint8_t>& bytes, size_t header,
                  int64_t expected, const std::string& path, const char* what,
                  const std::string& promise) {
  // expected < 2^63, so this cannot wrap in 64 bits.
  file.read(bytes, static_cast<size_t>(expected) + kTrailingProbe);
  const auto held = static_cast<int64_t>(bytes.size() - header);
  TORCH_CHECK(held >= expected, what, " ", path, ": truncated: the header promises ", promise,
              " (", expected, " bytes), the file holds ", held, " bytes after the header");
  TORCH_CHECK(held == expected || file.at_end(), what, " ", path, ": trailing data: ",
              kTrailingProbe, " bytes or more after the ", promise, " (", expected,
              " bytes) the header promises; reading stopped there");
  TORCH_CHECK(held == expected, what, " ", path, ": ", held - expected,
              " trailing bytes after the ", promise, " the header promises");
}

}  // namespace

at::Tensor read_idx_images(const std::string& path) {
  const char* what = "IDX images";
  detail::FileReader file(path, what);
  std::vector<uint8_t> bytes;
  const auto sizes = read_header(file, bytes, path, what, kImagesMagic, 3);
  const int64_t n = sizes[0], rows = sizes[1], cols = sizes[2];
  TORCH_CHECK(n > 0 && rows > 0 && cols > 0, what, " ", path, ": the header declares ", n,
              " images of ", rows, "x", cols, "; expected at least one non-empty image");
  // Each size is below 2^32, so rows * cols fits; n * rows * cols may not.
  const int64_t per_image = rows * cols;
  TORCH_CHECK(n <= (std::numeric_limits<int64_t>::max() - kTrailingProbe) / per_image, what, " ", path,
              ": the header declares an impossible size (", n, " images of ", rows, "x", cols,
              ")");
  const std::string promise = std::to_string(n) + " images of " + std::to_string(rows) + "x" +
                              std::to_string(cols);
  read_payload(file, bytes, 16, n * per_image, path, what, promise);
  auto images = at::empty({n, 1, rows, cols}, at::kByte);
  std::memcpy(images.data_ptr<uint8_t>(), bytes.data() + 16, static_cast<size_t>(n * per_image));
  return images;
}

at::Tensor read_idx_labels(const std::string& path) {
  const char* what = "IDX labels";
  detail::FileReader file(path, what);
  std::vector<uint8_t> bytes;
  const int64_t n = read_header(file, bytes, path, what, kLabelsMagic, 1)[0];
  TORCH_CHECK(n > 0, what, " ", path, ": the header declares 0 labels");
  read_payload(file, bytes, 8, n, path, what, std::to_string(n) + " labels");
  auto labels = at::empty({n}, at::kLong);
  auto* out = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) out[i] = bytes[8 + i];
  return labels;
}

}  // namespace convnn::data
