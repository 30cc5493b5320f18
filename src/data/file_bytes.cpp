#include "data/file_bytes.h"

#include <c10/util/Exception.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

namespace convnn::data::detail {
namespace {

// gzread takes an unsigned count; 4 MiB chunks keep the growth of the buffer cheap.
constexpr size_t kChunk = size_t{4} << 20;

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

// A raw file's size is its byte count; for gzip it only seeds the buffer.
size_t size_hint(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<size_t>(size);
}

GzHandle open_checked(const std::string& path, const char* what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  TORCH_CHECK(fs::exists(status), what, " ", path, ": no such file");
  TORCH_CHECK(fs::is_regular_file(status), what, " ", path, ": not a regular file");
  GzHandle file(gzopen(path.c_str(), "rb"));
  TORCH_CHECK(file != nullptr, what, " ", path, ": cannot open (", std::strerror(errno), ")");
  gzbuffer(file.get(), 1 << 20);
  return file;
}

}  // namespace

std::vector<uint8_t> read_file_bytes(const std::string& path, const char* what) {
  auto file = open_checked(path, what);
  std::vector<uint8_t> bytes;
  bytes.reserve(size_hint(path) + kChunk);  // + the final read that finds the end
  size_t used = 0;
  for (;;) {
    bytes.resize(used + kChunk);
    const int got = gzread(file.get(), bytes.data() + used, static_cast<unsigned>(kChunk));
    if (got < 0) {
      int code = Z_OK;
      const char* message = gzerror(file.get(), &code);
      TORCH_CHECK(false, what, " ", path, ": damaged gzip data (", message, ")");
    }
    used += static_cast<size_t>(got);
    if (got == 0) break;
  }
  bytes.resize(used);
  // A gzip stream cut short reads as a shorter file; zlib remembers it as Z_BUF_ERROR.
  int code = Z_OK;
  const char* message = gzerror(file.get(), &code);
  TORCH_CHECK(code == Z_OK, what, " ", path, ": truncated or damaged gzip data (", message, ")");
  return bytes;
}

std::string hex32(uint32_t value) {
  static const char* digits = "0123456789abcdef";
  std::string text = "0x00000000";
  for (int i = 9; i >= 2; --i, value >>= 4) text[i] = digits[value & 0xf];
  return text;
}

}  // namespace convnn::data::detail
