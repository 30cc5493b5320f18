#pragma once
// A decoded image as the input pipeline handles it before it becomes a tensor: 8-bit RGB,
// interleaved (height, width, channel), rows dense. Transforms work on it with plain loops, off
// the training thread, with no torch allocation per step.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace convnn::data {

struct Image {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 3;
  std::vector<uint8_t> pixels;  // height * width * channels bytes

  Image() = default;
  Image(int64_t h, int64_t w, int64_t c = 3)
      : height(h), width(w), channels(c), pixels(static_cast<size_t>(h * w * c)) {}

  bool empty() const { return pixels.empty(); }
  uint8_t* row(int64_t y) { return pixels.data() + y * width * channels; }
  const uint8_t* row(int64_t y) const { return pixels.data() + y * width * channels; }
  uint8_t* at(int64_t y, int64_t x) { return row(y) + x * channels; }
  const uint8_t* at(int64_t y, int64_t x) const { return row(y) + x * channels; }
};

}  // namespace convnn::data
