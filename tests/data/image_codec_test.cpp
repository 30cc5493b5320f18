// JPEG and PNG decoding (include/convnn/data/image_codec.h): every colour space and PNG layout to
// 8-bit RGB, errors naming the file for truncated, corrupt, empty and non-image files, thread
// safety, and real photographs from a Debian package.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "convnn/data/image_codec.h"
#include "data/fixtures.h"

namespace convnn::data {
namespace {

using testing::Bytes;
using testing::TempDir;
using testing::error_of;
using testing::expect_error;
using testing::png_claiming;
using testing::write_file;

// Debian's python-matplotlib-data (scripts/versions.sh): a photograph and two RGBA PNGs.
const std::string kSampleData = "/usr/share/matplotlib/mpl-data/sample_data/";

// Smooth content, as JPEG is made for: its loss stays within a few levels at high quality.
Image smooth_image(int64_t height, int64_t width, int64_t channels) {
  Image image(height, width, channels);
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      for (int64_t c = 0; c < channels; ++c) {
        const double v = std::sin(0.11 * x + 0.7 * c) * std::cos(0.07 * y - 0.3 * c);
        image.at(y, x)[c] = static_cast<uint8_t>(std::lround(128 + 90 * v));
      }
    }
  }
  return image;
}

// What a reader of the decoded image sees: three identical channels for gray.
Image as_rgb(const Image& gray) {
  Image rgb(gray.height, gray.width, 3);
  for (size_t i = 0; i < gray.pixels.size(); ++i) {
    std::fill_n(rgb.pixels.begin() + static_cast<std::ptrdiff_t>(3 * i), 3, gray.pixels[i]);
  }
  return rgb;
}

// The RGB an ink image (0 = no ink) prints as: paper times the black's transmission.
Image cmyk_to_rgb(const Image& ink) {
  Image rgb(ink.height, ink.width, 3);
  for (int64_t i = 0; i < ink.height * ink.width; ++i) {
    const uint8_t* p = ink.pixels.data() + 4 * i;
    for (int c = 0; c < 3; ++c) {
      rgb.pixels[3 * i + c] = static_cast<uint8_t>(((255 - p[c]) * (255 - p[3]) + 127) / 255);
    }
  }
  return rgb;
}

Image drop_alpha(const Image& rgba) {
  Image rgb(rgba.height, rgba.width, 3);
  for (int64_t i = 0; i < rgba.height * rgba.width; ++i) {
    std::copy_n(rgba.pixels.begin() + 4 * i, 3, rgb.pixels.begin() + 3 * i);
  }
  return rgb;
}

struct Difference {
  double mean = 0;
  int max = 0;
};

Difference difference(const Image& a, const Image& b) {
  Difference d;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    const int e = std::abs(int{a.pixels[i]} - int{b.pixels[i]});
    d.mean += e;
    d.max = std::max(d.max, e);
  }
  d.mean /= static_cast<double>(std::max<size_t>(a.pixels.size(), 1));
  return d;
}

Image decode(const Bytes& bytes) { return decode_image(bytes.data(), bytes.size(), "memory"); }

void expect_rgb_of_size(const Image& image, int64_t height, int64_t width) {
  EXPECT_EQ(image.height, height);
  EXPECT_EQ(image.width, width);
  EXPECT_EQ(image.channels, 3);
  EXPECT_EQ(image.pixels.size(), static_cast<size_t>(height * width * 3));
}

// JPEG at quality 95 (4:2:0 chroma for RGB): mean error about a level, none beyond a dozen.
void expect_jpeg_close(const Image& decoded, const Image& expected) {
  expect_rgb_of_size(decoded, expected.height, expected.width);
  const auto d = difference(decoded, expected);
  EXPECT_LT(d.mean, 1.5);
  EXPECT_LE(d.max, 12);
}

// The file without its APP14 "Adobe" segment: the same pixels, no longer marked as inverted.
Bytes without_adobe_marker(Bytes jpeg) {
  size_t pos = 2;  // after SOI
  while (pos + 4 <= jpeg.size() && jpeg[pos] == 0xff && jpeg[pos + 1] != 0xda) {
    const size_t length = 2 + (size_t{jpeg[pos + 2]} << 8 | jpeg[pos + 3]);
    if (jpeg[pos + 1] == 0xee) {
      jpeg.erase(jpeg.begin() + pos, jpeg.begin() + pos + length);
      return jpeg;
    }
    pos += length;
  }
  ADD_FAILURE() << "no APP14 (Adobe) segment before the scan";
  return jpeg;
}

// The first 0xff 0xda (start of scan) marker: entropy-coded data follows its header.
size_t scan_start(const Bytes& jpeg) {
  for (size_t i = 2; i + 1 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xff && jpeg[i + 1] == 0xda) return i;
  }
  ADD_FAILURE() << "no start of scan";
  return 0;
}

Bytes truncated(const Bytes& bytes, size_t size) { return Bytes(bytes.begin(), bytes.begin() + size); }

// The file with its baseline frame header (SOF0) claiming width x height; the scan data stays the
// original image's.
Bytes claiming_size(Bytes jpeg, uint16_t width, uint16_t height) {
  size_t pos = 2;  // after SOI
  while (pos + 9 <= jpeg.size() && jpeg[pos] == 0xff && jpeg[pos + 1] != 0xda) {
    if (jpeg[pos + 1] == 0xc0) {  // length (2), precision (1), height (2), width (2)
      jpeg[pos + 5] = static_cast<uint8_t>(height >> 8);
      jpeg[pos + 6] = static_cast<uint8_t>(height & 0xff);
      jpeg[pos + 7] = static_cast<uint8_t>(width >> 8);
      jpeg[pos + 8] = static_cast<uint8_t>(width & 0xff);
      return jpeg;
    }
    pos += 2 + (size_t{jpeg[pos + 2]} << 8 | jpeg[pos + 3]);
  }
  ADD_FAILURE() << "no SOF0 segment before the scan";
  return jpeg;
}

void expect_parts(const std::string& message, const std::vector<std::string>& parts) {
  for (const auto& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "expected '" << part << "' in\n" << message;
  }
}

TEST(ImageCodec, SniffFormatReadsMagicBytesNotNames) {
  const Bytes jpeg = encode_jpeg(smooth_image(8, 8, 3));
  const Bytes png = encode_png(smooth_image(8, 8, 3));
  EXPECT_EQ(sniff_format(jpeg.data(), jpeg.size()), ImageFormat::Jpeg);
  EXPECT_EQ(sniff_format(png.data(), png.size()), ImageFormat::Png);
  const Bytes text = {'h', 'e', 'l', 'l', 'o'};
  EXPECT_EQ(sniff_format(text.data(), text.size()), ImageFormat::Unknown);
  EXPECT_EQ(sniff_format(png.data(), 4), ImageFormat::Unknown);  // magic cut short
  EXPECT_EQ(sniff_format(nullptr, 0), ImageFormat::Unknown);
}

TEST(ImageCodec, JpegRgbRoundTripIsWithinQualityTolerance) {
  const auto image = smooth_image(75, 100, 3);
  expect_jpeg_close(decode(encode_jpeg(image, 95)), image);
}

TEST(ImageCodec, JpegGrayDecodesToThreeEqualChannels) {
  const auto gray = smooth_image(40, 56, 1);
  const auto decoded = decode(encode_jpeg(gray, 95));
  expect_jpeg_close(decoded, as_rgb(gray));
  for (size_t i = 0; i < decoded.pixels.size(); i += 3) {
    ASSERT_EQ(decoded.pixels[i], decoded.pixels[i + 1]) << "pixel " << i / 3;
    ASSERT_EQ(decoded.pixels[i], decoded.pixels[i + 2]) << "pixel " << i / 3;
  }
}

TEST(ImageCodec, JpegAdobeCmykDecodesToTheRgbItPrintsAs) {
  const auto ink = smooth_image(48, 40, 4);
  expect_jpeg_close(decode(encode_jpeg(ink, 95)), cmyk_to_rgb(ink));
}

TEST(ImageCodec, JpegAdobeYcckDecodesToTheRgbItPrintsAs) {
  const auto ink = smooth_image(48, 40, 4);
  expect_jpeg_close(decode(encode_jpeg_ycck(ink, 95)), cmyk_to_rgb(ink));
}

// Without the Adobe marker the stored values (255 - ink) are taken as ink themselves: proof that
// the decoder's inversion follows the marker.
TEST(ImageCodec, JpegCmykWithoutAdobeMarkerIsReadAsNonInverted) {
  const auto ink = smooth_image(48, 40, 4);
  Image stored = ink;
  for (auto& v : stored.pixels) v = static_cast<uint8_t>(255 - v);
  expect_jpeg_close(decode(without_adobe_marker(encode_jpeg(ink, 95))), cmyk_to_rgb(stored));
}

TEST(ImageCodec, PngGrayRgbAndRgbaRoundTripExactly) {
  const auto gray = smooth_image(9, 13, 1);
  const auto rgb = smooth_image(9, 13, 3);
  const auto rgba = smooth_image(9, 13, 4);
  EXPECT_EQ(decode(encode_png(gray)).pixels, as_rgb(gray).pixels);
  EXPECT_EQ(decode(encode_png(rgb)).pixels, rgb.pixels);
  const auto decoded = decode(encode_png(rgba));
  expect_rgb_of_size(decoded, 9, 13);
  EXPECT_EQ(decoded.pixels, drop_alpha(rgba).pixels);
}

TEST(ImageCodec, PngPaletteWithTransparencyDecodesToThePaletteColours) {
  testing::PngSpec spec;
  spec.width = 3;
  spec.height = 2;
  spec.color_type = 3;
  spec.palette = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
  spec.transparency = {0, 128};  // entries 0 and 1 (partly) transparent: colours kept
  spec.rows = {0, 1, 2, 3, 2, 1};
  const auto decoded = decode(testing::png_by_hand(spec));
  expect_rgb_of_size(decoded, 2, 3);
  EXPECT_EQ(decoded.pixels, (Bytes{255, 0, 0, 0, 255, 0, 0, 0, 255,  //
                                   10, 20, 30, 0, 0, 255, 0, 255, 0}));
}

TEST(ImageCodec, Png16BitDecodesToThe8BitValues) {
  testing::PngSpec rgb;
  rgb.width = 2;
  rgb.height = 1;
  rgb.bit_depth = 16;
  rgb.color_type = 2;
  // v * 257 is the 16-bit value of the 8-bit v, big-endian: 0x0000, 0x0101, ... 0xffff.
  const Bytes values = {0, 1, 17, 128, 254, 255};
  for (const uint8_t v : values) rgb.rows.insert(rgb.rows.end(), {v, v});
  EXPECT_EQ(decode(testing::png_by_hand(rgb)).pixels, values);

  testing::PngSpec gray = rgb;
  gray.width = 6;
  gray.color_type = 0;
  Image expected(1, 6, 1);
  expected.pixels = values;
  EXPECT_EQ(decode(testing::png_by_hand(gray)).pixels, as_rgb(expected).pixels);
}

TEST(ImageCodec, PngGrayAlphaAndOneBitGrayDecodeToRgb) {
  testing::PngSpec gray_alpha;
  gray_alpha.width = 2;
  gray_alpha.height = 1;
  gray_alpha.color_type = 4;
  gray_alpha.rows = {7, 0, 200, 255};  // (gray, alpha) pairs: alpha dropped
  EXPECT_EQ(decode(testing::png_by_hand(gray_alpha)).pixels, (Bytes{7, 7, 7, 200, 200, 200}));

  testing::PngSpec one_bit;
  one_bit.width = 10;
  one_bit.height = 1;
  one_bit.bit_depth = 1;
  one_bit.color_type = 0;
  one_bit.rows = {0b10110000, 0b01000000};  // 1 0 1 1 0 0 0 0 | 0 1, padded
  Image expected(1, 10, 1);
  expected.pixels = {255, 0, 255, 255, 0, 0, 0, 0, 0, 255};
  EXPECT_EQ(decode(testing::png_by_hand(one_bit)).pixels, as_rgb(expected).pixels);
}

TEST(ImageCodec, ReadImageDecodesByContentWhateverTheExtension) {
  // ImageNet's training set has a PNG named .JPEG (n02105855_2933.JPEG).
  TempDir dir;
  const auto rgb = smooth_image(6, 5, 3);
  write_file(dir.file("png_in_disguise.JPEG"), encode_png(rgb));
  EXPECT_EQ(read_image(dir.file("png_in_disguise.JPEG")).pixels, rgb.pixels);
}

TEST(ImageCodec, TruncatedJpegIsAnErrorNamingTheFile) {
  TempDir dir;
  const auto jpeg = encode_jpeg(smooth_image(64, 64, 3));
  const auto path = dir.file("cut.jpg");
  write_file(path, truncated(jpeg, jpeg.size() / 2));
  expect_error([&] { read_image(path); }, path, "Premature end of JPEG file");
  // Only the end-of-image marker missing: every pixel is there, the file is still cut.
  write_file(path, truncated(jpeg, jpeg.size() - 2));
  expect_error([&] { read_image(path); }, path, "Premature end of JPEG file");
  // Cut inside the headers.
  write_file(path, truncated(jpeg, 20));
  expect_error([&] { read_image(path); }, path, "JPEG image");
}

TEST(ImageCodec, TruncatedPngIsAnErrorNamingTheFile) {
  TempDir dir;
  const auto png = encode_png(smooth_image(64, 64, 3));
  const auto path = dir.file("cut.png");
  write_file(path, truncated(png, png.size() / 2));
  expect_error([&] { read_image(path); }, path, "truncated file");
  write_file(path, truncated(png, png.size() - 12));  // no IEND chunk: every pixel there
  expect_error([&] { read_image(path); }, path, "truncated file");
  write_file(path, truncated(png, 12));  // inside the signature and IHDR
  expect_error([&] { read_image(path); }, path, "PNG image");
}

TEST(ImageCodec, CorruptJpegDataIsAnErrorNamingTheFile) {
  TempDir dir;
  auto jpeg = encode_jpeg(smooth_image(64, 64, 3));
  // A marker in the middle of the entropy-coded data, as a damaged copy has: libjpeg warns
  // "Corrupt JPEG data" and fills the rest with grey; we refuse the file.
  const size_t middle = (scan_start(jpeg) + jpeg.size()) / 2;
  std::fill(jpeg.begin() + middle, jpeg.begin() + middle + 16, 0);
  jpeg[middle] = 0xff;
  jpeg[middle + 1] = 0xd9;
  const auto path = dir.file("corrupt.jpg");
  write_file(path, jpeg);
  expect_error([&] { read_image(path); }, path, "Corrupt JPEG data");
}

// Bytes between the last scan and the end-of-image marker, as some cameras write: libjpeg warns
// "extraneous bytes before marker 0xd9", yet every pixel was decoded, so the image is accepted.
TEST(ImageCodec, JpegWithBytesBeforeTheEndMarkerDecodesFully) {
  const auto jpeg = encode_jpeg(smooth_image(32, 32, 3));
  auto padded = jpeg;
  padded.insert(padded.end() - 2, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(decode(padded).pixels, decode(jpeg).pixels);
}

TEST(ImageCodec, CorruptPngDataIsAnErrorNamingTheFile) {
  TempDir dir;
  const auto path = dir.file("corrupt.png");
  // A damaged compressed stream: zlib or the row filters fail, whichever sees it first.
  auto png = encode_png(smooth_image(64, 64, 3));
  png[png.size() / 2] ^= 0x55;
  write_file(path, png);
  expect_error([&] { read_image(path); }, path, "PNG image");
  // A damaged pixel in uncompressed (stored) data: zlib's Adler-32 check of the stream tells.
  testing::PngSpec spec;
  spec.width = 4;
  spec.height = 4;
  spec.color_type = 0;
  spec.rows = Bytes(16, 100);
  const auto good = testing::png_by_hand(spec);
  const size_t idat_crc = good.size() - 12 - 4;  // IEND is the last 12 bytes
  auto bad_pixel = good;
  bad_pixel[idat_crc - 4 - 1] ^= 0x01;  // the last pixel, before the Adler-32
  write_file(path, bad_pixel);
  expect_error([&] { read_image(path); }, path, "incorrect data check");
  // Intact data under a damaged chunk checksum: libpng's CRC check tells.
  auto bad_crc = good;
  bad_crc[idat_crc] ^= 0x01;
  write_file(path, bad_crc);
  expect_error([&] { read_image(path); }, path, "IDAT: CRC error");
}

// PIL's decompression-bomb threshold (Image.MAX_IMAGE_PIXELS, 89,478,485, warns; twice it
// refuses): convnn cannot warn, so it refuses where PIL refuses.
TEST(ImageCodec, DefaultPixelLimitIsPilsRefusalThreshold) {
  EXPECT_EQ(kDefaultMaxImagePixels, 2 * 89478485);
}

// A 72-byte PNG claiming 100000x100000 pixels (30 GB of RGB) is refused from its header: a
// c10::Error naming the file, the claimed size, the limit and how to raise it, where the decoder
// used to allocate the claimed image and die of std::bad_alloc (or reach the OOM killer).
TEST(ImageCodec, PngClaimingTenBillionPixelsIsRefusedFromItsHeader) {
  const auto bomb = png_claiming(100000, 100000);
  EXPECT_LT(bomb.size(), 100u);
  expect_parts(error_of([&] { decode_image(bomb.data(), bomb.size(), "bomb.png"); }),
               {"PNG image bomb.png: its header claims 100000x100000 = 10000000000 pixels, more than the "
                "limit of 178956970 (max_image_pixels",
                "raise it with --max-image-pixels or the config's max_image_pixels"});
  TempDir dir;
  write_file(dir.file("bomb.png"), bomb);
  expect_error([&] { read_image(dir.file("bomb.png")); }, dir.file("bomb.png"),
               "100000x100000 = 10000000000 pixels, more than the limit of 178956970");
}

// A real 8x8 JPEG whose frame header is patched to claim 65500x65500 (libjpeg's largest, 12.9 GB
// of RGB) is refused from its header in the same way.
TEST(ImageCodec, JpegClaiming65500x65500IsRefusedFromItsHeader) {
  const auto real = encode_jpeg(smooth_image(8, 8, 3), 90);
  expect_rgb_of_size(decode(real), 8, 8);
  const auto bomb = claiming_size(real, 65500, 65500);
  expect_parts(error_of([&] { decode_image(bomb.data(), bomb.size(), "bomb.jpg"); }),
               {"JPEG image bomb.jpg: its header claims 65500x65500 = 4290250000 pixels, more than the "
                "limit of 178956970 (max_image_pixels",
                "--max-image-pixels"});
  // A claim within the limit is not refused for its size, whatever its data then give.
  const auto small_claim = claiming_size(real, 24, 24);
  const auto message = error_of([&] { decode_image(small_claim.data(), small_claim.size(), "x.jpg"); });
  EXPECT_EQ(message.find("limit"), std::string::npos) << message;
}

// The limit is the caller's and inclusive: an 8x6 image (48 pixels) decodes with a limit of 48
// and is refused with 47, as JPEG and as PNG; a limit below 1 is an error naming it.
TEST(ImageCodec, PixelLimitIsTheCallersAndInclusive) {
  const auto image = smooth_image(6, 8, 3);
  const std::vector<std::pair<Bytes, std::string>> files = {{encode_jpeg(image, 95), "JPEG"},
                                                            {encode_png(image), "PNG"}};
  for (const auto& file : files) {
    const Bytes& bytes = file.first;
    const std::string& format = file.second;
    expect_rgb_of_size(decode_image(bytes.data(), bytes.size(), "small", 48), 6, 8);
    expect_parts(error_of([&] { decode_image(bytes.data(), bytes.size(), "small", 47); }),
                 {format + " image small: its header claims 8x6 = 48 pixels, more than the limit of 47"});
    expect_parts(error_of([&] { decode_image(bytes.data(), bytes.size(), "small", 0); }),
                 {"image small: max_pixels (max_image_pixels) must be >= 1, got 0"});
  }
}

TEST(ImageCodec, EmptyNonImageAndMissingFilesAreErrorsNamingTheFile) {
  TempDir dir;
  write_file(dir.file("empty.jpg"), {});
  expect_error([&] { read_image(dir.file("empty.jpg")); }, dir.file("empty.jpg"), "file is empty");
  write_file(dir.file("notes.png"), {'h', 'e', 'l', 'l', 'o', '\n'});
  expect_error([&] { read_image(dir.file("notes.png")); }, dir.file("notes.png"),
               "not a JPEG or PNG file (it starts with 68 65 6c 6c 6f 0a");
  expect_error([&] { read_image(dir.file("missing.jpg")); }, dir.file("missing.jpg"),
               "no such file");
  expect_error([&] { read_image(dir.path().string()); }, dir.path().string(),
               "not a regular file");
}

TEST(ImageCodec, EncodersRejectUnsupportedImages) {
  EXPECT_NE(error_of([] { encode_jpeg(Image(4, 4, 2)); }).find("2 channels"), std::string::npos);
  EXPECT_NE(error_of([] { encode_png(Image(4, 4, 2)); }).find("2 channels"), std::string::npos);
  EXPECT_NE(error_of([] { encode_jpeg(Image(4, 4, 3), 0); }).find("quality 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { encode_png(Image()); }).find("is empty"), std::string::npos);
  EXPECT_NE(error_of([] { encode_jpeg_ycck(Image(4, 4, 3)); }).find("3 channels"),
            std::string::npos);
}

// No global state: threads decoding at once, some of them failing, get the same results as one.
TEST(ImageCodec, ConcurrentDecodingGivesTheSameResultsAsSerial) {
  const auto jpeg = encode_jpeg(smooth_image(96, 80, 3));
  const auto png = encode_png(smooth_image(96, 80, 3));
  const auto cut = truncated(jpeg, jpeg.size() / 2);
  const auto jpeg_pixels = decode(jpeg).pixels;
  const auto png_pixels = decode(png).pixels;
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < mismatches.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        mismatches[t] += decode(jpeg).pixels != jpeg_pixels;
        mismatches[t] += decode(png).pixels != png_pixels;
        mismatches[t] += error_of([&] { decode(cut); }).find("Premature end") == std::string::npos;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (size_t t = 0; t < mismatches.size(); ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

// A real photograph (Grace Hopper, 512x600 baseline JPEG from Wikimedia Commons, shipped by
// python-matplotlib-data): the right size, a full range of tones, and colour.
TEST(ImageCodec, RealPhotographJpegDecodesToAPlausibleColourImage) {
  const auto path = kSampleData + "grace_hopper.jpg";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "missing " << path;
  const auto image = read_image(path);
  expect_rgb_of_size(image, 600, 512);
  double sum[3] = {0, 0, 0}, sum_sq = 0;
  int low = 255, high = 0, colourful = 0;
  for (int64_t i = 0; i < image.height * image.width; ++i) {
    const uint8_t* p = image.pixels.data() + 3 * i;
    for (int c = 0; c < 3; ++c) {
      sum[c] += p[c];
      sum_sq += static_cast<double>(p[c]) * p[c];
      low = std::min<int>(low, p[c]);
      high = std::max<int>(high, p[c]);
    }
    colourful += std::abs(int{p[0]} - int{p[2]}) > 30;
  }
  const double n = static_cast<double>(image.height * image.width);
  const double mean = (sum[0] + sum[1] + sum[2]) / (3 * n);
  const double stddev = std::sqrt(sum_sq / (3 * n) - mean * mean);
  for (const double s : sum) {
    EXPECT_GT(s / n, 30);
    EXPECT_LT(s / n, 225);
  }
  EXPECT_GT(stddev, 30);  // a photograph, not a flat grey fill
  EXPECT_LT(low, 20);
  EXPECT_GT(high, 235);
  EXPECT_GT(colourful, n / 20);  // not gray: the uniform is navy, the background warm
}

TEST(ImageCodec, RealRgbaPngsDecodeToRgbOfTheirSize) {
  struct Case {
    const char* name;
    int64_t height, width;
  };
  for (const Case c : {Case{"logo2.png", 120, 560}, Case{"Minduka_Present_Blue_Pack.png", 128, 128}}) {
    const auto path = kSampleData + c.name;
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "missing " << path;
    const auto image = read_image(path);
    expect_rgb_of_size(image, c.height, c.width);
    const auto [low, high] = std::minmax_element(image.pixels.begin(), image.pixels.end());
    EXPECT_LT(*low, *high) << path << " decoded to a single value";
  }
}

}  // namespace
}  // namespace convnn::data
