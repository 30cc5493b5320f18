#pragma once
// JPEG (libjpeg-turbo) and PNG (libpng) decoding to 8-bit RGB, and encoding for tests and
// generated benchmark data. Decoding never returns a partial image: any error or warning from the
// codec (truncated data, bad markers, CRC errors) is a c10::Error naming the file. Nor does it
// allocate for the size a header claims before checking it: a 100-byte PNG may claim
// 100000x100000 pixels (30 GB of RGB), so an image above a pixel limit is a c10::Error too.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "convnn/data/image.h"

namespace convnn::data {

enum class ImageFormat { Jpeg, Png, Unknown };

/// From the leading magic bytes (not from the file name).
ImageFormat sniff_format(const uint8_t* data, size_t size);

/// The default pixel limit (width x height) of decoding: PIL's DecompressionBombError threshold,
/// 2 x Image.MAX_IMAGE_PIXELS (2 x 89,478,485). PIL warns above MAX_IMAGE_PIXELS and refuses
/// above twice it; a library that never prints cannot warn, so it refuses where PIL refuses. The
/// largest image it admits costs 537 MB of RGB (e.g. 13,000 x 13,000 pixels).
inline constexpr int64_t kDefaultMaxImagePixels = 178956970;

/// Decodes a JPEG or PNG held in memory to RGB: grayscale is replicated, CMYK / YCCK JPEGs
/// (including Adobe's inverted CMYK) are converted, PNG palettes, alpha (dropped) and 16-bit
/// samples are reduced to 8-bit RGB. `name` only labels errors. An image whose header claims more
/// than `max_pixels` pixels (width x height) is refused from its header, before anything of its
/// size is allocated: a c10::Error naming the file, the claimed size, the limit and the option
/// that raises it (max_image_pixels); `max_pixels` must be >= 1.
Image decode_image(const uint8_t* data, size_t size, const std::string& name,
                   int64_t max_pixels = kDefaultMaxImagePixels);
/// Reads and decodes one file, as decode_image.
Image read_image(const std::string& path, int64_t max_pixels = kDefaultMaxImagePixels);

/// Baseline JPEG, quality in [1, 100]; 1-channel images are written as grayscale, 3 as RGB,
/// 4 as CMYK: the image holds ink amounts (0 = none), the file Photoshop's convention (an Adobe
/// APP14 marker and 255 - ink), so tests can produce every colour space the decoder handles.
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 90);
/// A 4-channel CMYK image as an Adobe YCCK JPEG (transform 2, inverted like encode_jpeg's CMYK),
/// the other colour space of print JPEGs, so tests reach the decoder's YCCK path too.
std::vector<uint8_t> encode_jpeg_ycck(const Image& image, int quality = 90);
/// 8-bit PNG; 1, 3 or 4 channels (gray, RGB, RGBA).
std::vector<uint8_t> encode_png(const Image& image);

}  // namespace convnn::data
