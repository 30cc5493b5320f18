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

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "<no error>";
}

void expect_error(const std::function<void()>& f, const std::string& path,
                  const std::string& what) {
  const auto message = error_of(f);
  EXPECT_NE(message.find(path), std::string::npos) << "expected the path " << path << " in\n"
                                                    << message;
  EXPECT_NE(message.find(what), std::string::npos) << "expected '" << what << "' in\n"
                                                    << message;
}

}  // namespace convnn::testing
