#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace convnn::data::detail {

// The whole file, transparently gunzipped when it is gzip-compressed. Raises c10::Error naming the
// path when it is missing, unreadable or a corrupt gzip stream.
std::vector<uint8_t> read_file_bytes(const std::string& path);

}  // namespace convnn::data::detail
