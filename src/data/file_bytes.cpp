#include "data/file_bytes.h"

#include <c10/util/Exception.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace convnn::data::detail {
namespace {

// gzread takes an unsigned count; 4 MiB steps keep the growth of the buffer cheap.
constexpr size_t kChunk = size_t{4} << 20;
// gzread returns an int: no read asks for more.
constexpr size_t kMaxStep = size_t{1} << 30;

// A raw file's size is its byte count; for gzip it only seeds the buffer.
size_t size_hint(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<size_t>(size);
}

}  // namespace

FileReader::FileReader(const std::string& path, const char* what) : path_(path), what_(what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  TORCH_CHECK(fs::exists(status), what, " ", path, ": no such file");
  TORCH_CHECK(fs::is_regular_file(status), what, " ", path, ": not a regular file");
  file_ = gzopen(path.c_str(), "rb");
  TORCH_CHECK(file_ != nullptr, what, " ", path, ": cannot open (", std::strerror(errno), ")");
  gzbuffer(file_, 1 << 20);
  size_hint_ = size_hint(path);
}

FileReader::~FileReader() { gzclose(file_); }

void FileReader::read(std::vector<uint8_t>& bytes, size_t count) {
  // Never more than the file's size ahead (a raw file's exact size): a count from a header that
  // claims terabytes allocates nothing beyond what arrives.
  bytes.reserve(bytes.size() + std::min(count, size_hint_ + 1));
  while (count > 0 && !at_end_) {
    const size_t used = bytes.size();
    // What is reserved first (a raw file fits), then steps that grow the buffer geometrically.
    const size_t step =
        std::min({count, bytes.capacity() > used ? bytes.capacity() - used : kChunk, kMaxStep});
    bytes.resize(used + step);
    const int got = gzread(file_, bytes.data() + used, static_cast<unsigned>(step));
    if (got < 0) {
      int code = Z_OK;
      const char* message = gzerror(file_, &code);
      TORCH_CHECK(false, what_, " ", path_, ": damaged gzip data (", message, ")");
    }
    bytes.resize(used + static_cast<size_t>(got));
    count -= static_cast<size_t>(got);
    at_end_ = got == 0;
  }
  if (at_end_) {
    // A gzip stream cut short reads as a shorter file; zlib remembers it as Z_BUF_ERROR.
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    TORCH_CHECK(code == Z_OK, what_, " ", path_, ": truncated or damaged gzip data (", message, ")");
  }
}

std::vector<uint8_t> read_file_bytes(const std::string& path, const char* what, size_t max_bytes,
                                     const std::string& limit_reason) {
  FileReader file(path, what);
  std::vector<uint8_t> bytes;
  file.read(bytes, max_bytes + 1);
  TORCH_CHECK(bytes.size() <= max_bytes, what, " ", path, ": holds more than ", max_bytes,
              " bytes (", limit_reason, "); reading stopped there");
  return bytes;
}

std::string hex32(uint32_t value) {
  static const char* digits = "0123456789abcdef";
  std::string text = "0x00000000";
  for (int i = 9; i >= 2; --i, value >>= 4) text[i] = digits[value & 0xf];
  return text;
}

}  // namespace convnn::data::detail
