#pragma once
// Bounded reads for the data set readers, raw or gzip-compressed alike: every read says how many
// bytes it wants at most, so that a small gzip file that inflates to gigabytes (a decompression
// bomb) costs only what the reader asked for.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct gzFile_s;  // zlib's

namespace convnn::data::detail {

/// A file's (decompressed) bytes, read in steps. zlib's gzread passes files that are not gzip
/// through unchanged, so one reader serves both.
class FileReader {
 public:
  /// Opens `path`: c10::Error naming `what` and the path when it is missing, not a regular file or
  /// cannot be opened.
  FileReader(const std::string& path, const char* what);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  /// Appends the next `count` bytes to `bytes`, or fewer when the file ends first; inflates no
  /// more than that (give or take zlib's buffer of 2 MiB). The buffer grows as the data comes, so
  /// a `count` taken from a header costs nothing when the file is short. c10::Error naming `what`
  /// and the path for damaged gzip data, or a gzip stream cut short.
  void read(std::vector<uint8_t>& bytes, size_t count);
  /// Whether a read found the end of the file.
  bool at_end() const { return at_end_; }

 private:
  std::string path_;
  const char* what_;
  gzFile_s* file_ = nullptr;
  size_t size_hint_ = 0;  // a raw file's size; a gzip file's compressed size
  bool at_end_ = false;
};

/// The (decompressed) bytes of `path`, which must hold at most `max_bytes`: c10::Error naming
/// `what`, the path, the limit and `limit_reason` when it holds more (found by inflating
/// max_bytes + 1 bytes, no more), and as FileReader's.
std::vector<uint8_t> read_file_bytes(const std::string& path, const char* what, size_t max_bytes,
                                     const std::string& limit_reason);

/// 0x00000803-style hexadecimal, for magic numbers in messages.
std::string hex32(uint32_t value);

}  // namespace convnn::data::detail
