#pragma once
// Whole-file reads for the data set readers, raw or gzip-compressed alike.
#include <cstdint>
#include <string>
#include <vector>

namespace convnn::data::detail {

/// The (decompressed) bytes of `path`. zlib's gzread passes files that are not gzip through
/// unchanged, so one reader serves both. c10::Error naming `what` and the path when the file is
/// missing, not a regular file, unreadable or a damaged gzip stream.
std::vector<uint8_t> read_file_bytes(const std::string& path, const char* what);

/// 0x00000803-style hexadecimal, for magic numbers in messages.
std::string hex32(uint32_t value);

}  // namespace convnn::data::detail
