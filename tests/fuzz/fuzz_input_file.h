#pragma once
// The fuzz targets' input as a file: convnn's readers take paths, as its users give them. One file
// per process, rewritten for every input (in /dev/shm where it exists, so no disk is touched).
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace convnn::fuzz {

inline const std::string& write_input(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string path = (std::filesystem::exists("/dev/shm") ? std::string("/dev/shm") : std::string("/tmp")) +
                                  "/convnn-fuzz-" + std::to_string(getpid()) + suffix;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace convnn::fuzz
