#include "data/file_bytes.h"

#include <c10/util/Exception.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

namespace convnn::data::detail {

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  TORCH_CHECK(std::filesystem::is_regular_file(path), "dataset file not found: ", path);
  // gzopen reads plain files as they are and decompresses gzip ones.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
  TORCH_CHECK(file, "cannot open dataset file ", path, ": ", std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t buffer[1 << 16];
  while (true) {
    const int n = gzread(file.get(), buffer, sizeof(buffer));
    if (n < 0) {
      int code = 0;
      const char* message = gzerror(file.get(), &code);
      TORCH_CHECK(false, "corrupt or truncated dataset file ", path, ": ", message);
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), buffer, buffer + n);
  }
  // zlib reports a gzip stream cut short only through gzerror after EOF.
  int code = 0;
  const char* message = gzerror(file.get(), &code);
  TORCH_CHECK(code == Z_OK || code == Z_STREAM_END, "corrupt or truncated dataset file ", path, ": ", message);
  return bytes;
}

}  // namespace convnn::data::detail
