#include "data/fixtures.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <fstream>
#include <random>

namespace convnn::testing {
namespace {

void append32(Bytes& out, uint32_t value, bool big_endian) {
  for (int i = 0; i < 4; ++i) {
    const int shift = big_endian ? 8 * (3 - i) : 8 * i;
    out.push_back(static_cast<uint8_t>(value >> shift));
  }
}

uint32_t crc32(const Bytes& data) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xffffffffu;
  for (const uint8_t byte : data) crc = table[(crc ^ byte) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

Bytes tensor_bytes(const at::Tensor& t) {
  const auto bytes = t.to(at::kByte).contiguous();
  const auto* p = bytes.data_ptr<uint8_t>();
  return Bytes(p, p + bytes.numel());
}

// Not std::filesystem::remove_all: the torch 2.11 wheel's libtorch.so exports its own copy of
// it, which the dynamic linker prefers, and that copy crashes (a call through a null pointer).
void remove_tree(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(std::filesystem::symlink_status(path, ec))) {
    for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
      remove_tree(entry.path());
    }
  }
  std::filesystem::remove(path, ec);
}

}  // namespace

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = info ? std::string(info->test_suite_name()) + "_" + info->name() : "x";
  path_ = std::filesystem::temp_directory_path() /
          ("convnn_data_" + name + "_" + std::to_string(std::random_device{}()) + "_" +
           std::to_string(counter++));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() { remove_tree(path_); }

std::string TempDir::file(const std::string& name) const { return (path_ / name).string(); }

void write_file(const std::string& path, const Bytes& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

Bytes gzip_stored(const Bytes& data) {
  Bytes out = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};  // deflate, no flags, no mtime, unknown OS
  size_t pos = 0;
  do {
    const size_t len = std::min<size_t>(65535, data.size() - pos);
    const bool last = pos + len == data.size();
    out.push_back(last ? 1 : 0);  // BFINAL, BTYPE = 00 (stored)
    const uint16_t n = static_cast<uint16_t>(len), nn = static_cast<uint16_t>(~n);
    out.insert(out.end(), {uint8_t(n & 0xff), uint8_t(n >> 8), uint8_t(nn & 0xff),
                           uint8_t(nn >> 8)});
    out.insert(out.end(), data.begin() + pos, data.begin() + pos + len);
    pos += len;
  } while (pos < data.size());
  append32(out, crc32(data), false);
  append32(out, static_cast<uint32_t>(data.size()), false);
  return out;
}

Bytes idx_images(const at::Tensor& images) {
  Bytes out;
  append32(out, 0x803, true);
  append32(out, static_cast<uint32_t>(images.size(0)), true);
  append32(out, static_cast<uint32_t>(images.size(-2)), true);
  append32(out, static_cast<uint32_t>(images.size(-1)), true);
  const auto pixels = tensor_bytes(images);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

Bytes idx_labels(const at::Tensor& labels) {
  Bytes out;
  append32(out, 0x801, true);
  append32(out, static_cast<uint32_t>(labels.size(0)), true);
  const auto values = tensor_bytes(labels);
  out.insert(out.end(), values.begin(), values.end());
  return out;
}

Bytes cifar_records(const at::Tensor& images, const at::Tensor& labels,
                    const at::Tensor& coarse) {
  const auto pixels = tensor_bytes(images);
  const auto fine = tensor_bytes(labels);
  const auto coarse_bytes = coarse.defined() ? tensor_bytes(coarse) : Bytes{};
  const size_t plane = 3 * 32 * 32;
  Bytes out;
  for (size_t i = 0; i < fine.size(); ++i) {
    if (coarse.defined()) out.push_back(coarse_bytes[i]);
    out.push_back(fine[i]);
    out.insert(out.end(), pixels.begin() + i * plane, pixels.begin() + (i + 1) * plane);
  }
  return out;
}

at::Tensor random_images(at::IntArrayRef shape, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(0, 256, shape, generator, at::TensorOptions().dtype(at::kByte));
}

void expect_error(const std::function<void()>& f, const std::string& path,
                  const std::string& what) {
  const auto message = error_of(f);
  EXPECT_NE(message.find(path), std::string::npos) << "expected the path " << path << " in\n"
                                                    << message;
  EXPECT_NE(message.find(what), std::string::npos) << "expected '" << what << "' in\n"
                                                    << message;
}

namespace {

uint32_t adler32(const Bytes& data) {
  uint32_t a = 1, b = 0;
  for (const uint8_t byte : data) {
    a = (a + byte) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

// A zlib stream: gzip_stored's deflate blocks between zlib's header and trailer.
Bytes zlib_stored(const Bytes& data) {
  const Bytes gzip = gzip_stored(data);
  Bytes out = {0x78, 0x01};  // deflate, 32 KiB window, no dictionary, check bits
  out.insert(out.end(), gzip.begin() + 10, gzip.end() - 8);
  append32(out, adler32(data), true);
  return out;
}

void append_chunk(Bytes& out, const char* type, const Bytes& data) {
  append32(out, static_cast<uint32_t>(data.size()), true);
  Bytes typed(type, type + 4);
  typed.insert(typed.end(), data.begin(), data.end());
  out.insert(out.end(), typed.begin(), typed.end());
  append32(out, crc32(typed), true);
}

}  // namespace

Bytes png_by_hand(const PngSpec& spec) {
  Bytes header;
  append32(header, spec.width, true);
  append32(header, spec.height, true);
  header.insert(header.end(), {spec.bit_depth, spec.color_type, 0, 0, 0});
  // Each row behind its filter byte (0: none).
  const size_t row_bytes = spec.height ? spec.rows.size() / spec.height : 0;
  Bytes filtered;
  for (uint32_t y = 0; y < spec.height; ++y) {
    filtered.push_back(0);
    const auto row = spec.rows.begin() + static_cast<std::ptrdiff_t>(y * row_bytes);
    filtered.insert(filtered.end(), row, row + static_cast<std::ptrdiff_t>(row_bytes));
  }
  Bytes out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  append_chunk(out, "IHDR", header);
  if (!spec.palette.empty()) append_chunk(out, "PLTE", spec.palette);
  if (!spec.transparency.empty()) append_chunk(out, "tRNS", spec.transparency);
  append_chunk(out, "IDAT", zlib_stored(filtered));
  append_chunk(out, "IEND", {});
  return out;
}

Bytes png_claiming(uint32_t width, uint32_t height) {
  Bytes header;
  append32(header, width, true);
  append32(header, height, true);
  header.insert(header.end(), {8, 2, 0, 0, 0});  // 8-bit RGB, no interlace
  Bytes out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  append_chunk(out, "IHDR", header);
  // The filter byte and first pixel of row 0 (4 zero bytes) as a zlib stream: header, one stored
  // block (length 4 and its complement), the bytes, their Adler-32 (1 + 4 * 65536).
  append_chunk(out, "IDAT", {0x78, 0x01, 0x01, 0x04, 0x00, 0xfb, 0xff, 0, 0, 0, 0, 0x00, 0x04, 0x00, 0x01});
  append_chunk(out, "IEND", {});
  return out;
}

namespace {

// Bits into bytes, least significant first (RFC 1951, 3.1.1): header fields and extra bits go in
// as numbers (least significant bit first), Huffman codes most significant bit first.
class BitWriter {
 public:
  void number(uint32_t value, int bits) {
    for (int i = 0; i < bits; ++i) put((value >> i) & 1);
  }
  void code(uint32_t code, int bits) {
    for (int i = bits - 1; i >= 0; --i) put((code >> i) & 1);
  }
  Bytes& bytes() { return out_; }

 private:
  void put(uint32_t bit) {
    if (used_ == 0) out_.push_back(0);
    out_.back() = static_cast<uint8_t>(out_.back() | (bit << used_));
    used_ = (used_ + 1) % 8;
  }
  Bytes out_;
  int used_ = 0;
};

// The fixed Huffman codes (RFC 1951, 3.2.6) of a literal byte.
void fixed_literal(BitWriter& w, uint8_t byte) {
  if (byte < 144) {
    w.code(0x30u + byte, 8);
  } else {
    w.code(0x190u + (byte - 144u), 9);
  }
}

}  // namespace

Bytes gzip_bomb(const Bytes& prefix, uint64_t zeros) {
  BitWriter w;
  w.number(1, 1);  // BFINAL
  w.number(1, 2);  // BTYPE 01: fixed Huffman codes
  for (const uint8_t byte : prefix) fixed_literal(w, byte);
  uint64_t left = zeros;
  if (left > 0) {
    fixed_literal(w, 0);
    --left;
  }
  for (; left >= 258; left -= 258) {
    w.code(0xc0u + (285 - 280), 8);  // length 258 (symbol 285, no extra bits)
    w.code(0, 5);                    // distance 1 (code 0, no extra bits)
  }
  for (; left > 0; --left) fixed_literal(w, 0);
  w.code(0, 7);  // end of block (symbol 256)
  Bytes out = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  out.insert(out.end(), w.bytes().begin(), w.bytes().end());
  append32(out, 0, false);  // CRC-32: wrong on purpose
  append32(out, 0, false);  // ISIZE: wrong on purpose
  return out;
}

}  // namespace convnn::testing

namespace convnn::testing {

data::Image random_image(int64_t height, int64_t width, uint64_t seed, int64_t channels) {
  data::Image image(height, width, channels);
  const auto bytes = random_images({height, width, channels}, seed);
  std::copy_n(bytes.data_ptr<uint8_t>(), image.pixels.size(), image.pixels.data());
  return image;
}

at::Tensor image_tensor(const data::Image& image) {
  return at::from_blob(const_cast<uint8_t*>(image.pixels.data()),
                       {image.height, image.width, image.channels}, at::kByte)
      .clone();
}

}  // namespace convnn::testing

#include <fmt/format.h>

#include "convnn/data/image_codec.h"

namespace convnn::testing {
namespace {

// A flat tint per class (so the classes can be learnt) with per-pixel noise.
data::Image class_image(const ImageFolderSpec& spec, int64_t label, uint64_t seed) {
  auto image = random_image(spec.height, spec.width, seed);
  const uint8_t tint[3] = {static_cast<uint8_t>(60 * (label % 4)), static_cast<uint8_t>(40 * (label % 5)),
                           static_cast<uint8_t>(200 - 50 * (label % 3))};
  for (size_t i = 0; i < image.pixels.size(); ++i) {
    image.pixels[i] = static_cast<uint8_t>((tint[i % 3] * 3 + image.pixels[i]) / 4);
  }
  return image;
}

Bytes encoded(const data::Image& image, int64_t index) {
  return index % 3 == 2 ? data::encode_png(image) : data::encode_jpeg(image, 90);
}

std::string image_name(const std::string& stem, int64_t index) {
  return fmt::format("{}_{:03d}.{}", stem, index, index % 3 == 2 ? "png" : "jpg");
}

}  // namespace

void write_image_folder(const std::string& root, const ImageFolderSpec& spec) {
  const auto dir = std::filesystem::path(root);
  std::string labels;
  for (int64_t c = 0; c < spec.classes; ++c) {
    const auto name = fmt::format("c{}", c);
    for (int64_t i = 0; i < spec.train_per_class; ++i) {
      const uint64_t seed = static_cast<uint64_t>(1000 * c + i);
      write_file((dir / "train" / name / image_name("train", i)).string(),
                 encoded(class_image(spec, c, seed), i));
    }
    for (int64_t i = 0; i < spec.val_per_class; ++i) {
      const uint64_t seed = static_cast<uint64_t>(1000 * c + 500 + i);
      const int64_t n = c * spec.val_per_class + i;
      const auto file = spec.flat_val ? (dir / "val" / image_name("val", n))
                                      : (dir / "val" / name / image_name("val", i));
      write_file(file.string(), encoded(class_image(spec, c, seed), spec.flat_val ? n : i));
      labels += fmt::format("{} {}\n", file.filename().string(), name);
    }
  }
  if (spec.flat_val) {
    write_file((dir / "val_labels.txt").string(), Bytes(labels.begin(), labels.end()));
  }
}

void write_garbage(const std::string& path) {
  const std::string text = "<!DOCTYPE html> this is no image";
  write_file(path, Bytes(text.begin(), text.end()));
}

void truncate_half(const std::string& path) {
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
}

}  // namespace convnn::testing
