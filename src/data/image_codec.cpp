// JPEG through libjpeg-turbo's libjpeg API, PNG through libpng: the reference decoders of both
// formats, SIMD-accelerated for JPEG, both in Debian. See docs/image-data.md.
//
// Both libraries report errors by calling a handler that must not return; ours longjmp back to
// the decoding function, which then throws a c10::Error. So that the jump skips no destructor
// (undefined behaviour by [csetjmp.syn]), every function that calls setjmp holds only trivially
// destructible locals and allocates nothing C++ after it that would outlive a later jump; the
// codec objects are freed by guards in the calling frame. No state is global: any number of
// threads may decode at once.
#include "convnn/data/image_codec.h"

#include <c10/util/Exception.h>
#include <png.h>

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <new>
#include <system_error>

// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>
#include <jpeglib.h>

namespace convnn::data {
namespace {

constexpr uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

// "ff d8 ff e0" for error messages about what a file starts with.
std::string leading_bytes(const uint8_t* data, size_t size) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  for (size_t i = 0; i < std::min<size_t>(size, 8); ++i) {
    if (i) text += ' ';
    text += kDigits[data[i] >> 4];
    text += kDigits[data[i] & 0xf];
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// The pixel limit: checked on the size a header claims, before anything of that size exists

// The width and height a header claims, kept for the message when they are refused.
struct Claimed {
  uint64_t width = 0, height = 0;
};

// What the decode_*_into functions return for an image above the limit: they may not allocate
// (see the top), so the calling frame writes the message.
constexpr const char* kAboveLimit = "above the pixel limit";

// Whatever the limit, height * width * channels (4 at most, CMYK) must fit in int64_t, which
// Image's size and row offsets are computed in: beyond this a product would wrap and the buffer
// would be smaller than the rows written into it.
constexpr uint64_t kMaxAddressablePixels = uint64_t{std::numeric_limits<int64_t>::max()} / 4;

// Both sides are below 2^32 (JDIMENSION and png_uint_32), so their product fits in 64 bits.
static_assert(sizeof(JDIMENSION) <= 4 && sizeof(png_uint_32) <= 4);

uint64_t pixel_limit(int64_t max_pixels) {
  return std::min(static_cast<uint64_t>(max_pixels), kMaxAddressablePixels);
}

bool within_limit(const Claimed& claimed, int64_t max_pixels) {
  return claimed.width * claimed.height <= pixel_limit(max_pixels);
}

void refuse_above_limit(const char* format, const std::string& name, const Claimed& claimed,
                        int64_t max_pixels) {
  TORCH_CHECK(false, format, " image ", name, ": its header claims ", claimed.width, "x",
              claimed.height, " = ", claimed.width * claimed.height, " pixels, more than the limit of ",
              pixel_limit(max_pixels),
              " (max_image_pixels, a guard against decompression bombs; raise it with "
              "--max-image-pixels or the config's max_image_pixels if the image is genuine)");
}

// ---------------------------------------------------------------------------------------------
// JPEG decoding

// libjpeg passes the jpeg_error_mgr* back to the handlers; `pub` first lets them reach the rest.
struct JpegErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  cinfo->err->format_message(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// libjpeg only warns about corrupt or truncated data and goes on, filling what it could not decode
// with grey: such an image must not reach training, so a warning is an error. The exceptions
// leave every pixel decoded: warnings about metadata that decoding ignores, and bytes between
// the end of the last scan and the end-of-image marker ("Corrupt JPEG data: N extraneous bytes
// before marker 0xd9", common in camera files); data cut short inside a scan is no such case,
// as libjpeg would have warned of a premature end or a marker hit first.
void jpeg_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  const auto& err = *cinfo->err;
  if (err.msg_code == JWRN_JFIF_MAJOR || err.msg_code == JWRN_BOGUS_ICC) return;
  if (err.msg_code == JWRN_EXTRANEOUS_DATA && err.msg_parm.i[1] == JPEG_EOI) return;
  jpeg_fail(cinfo);
}

void init_jpeg_errors(JpegErrorManager& err) {
  jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_fail;
  err.pub.emit_message = jpeg_message;
  err.message[0] = '\0';
}

// Frees the decompressor however decoding ends; safe on a zeroed, never created struct.
struct JpegDecompressGuard {
  jpeg_decompress_struct* cinfo;
  ~JpegDecompressGuard() { jpeg_destroy_decompress(cinfo); }
};

// CMYK (or YCCK, which libjpeg turns into CMYK) to RGB. Photoshop, which writes the Adobe
// marker, stores 255 - ink; other writers store the ink itself.
void cmyk_row_to_rgb(const JSAMPLE* cmyk, uint8_t* rgb, JDIMENSION width, bool inverted) {
  for (JDIMENSION x = 0; x < width; ++x, cmyk += 4, rgb += 3) {
    const int k = inverted ? cmyk[3] : 255 - cmyk[3];
    for (int c = 0; c < 3; ++c) {
      const int paper = inverted ? cmyk[c] : 255 - cmyk[c];  // 255 - ink
      rgb[c] = static_cast<uint8_t>((paper * k + 127) / 255);
    }
  }
}

// RGB straight into the image's rows: libjpeg-turbo converts gray and YCbCr itself (SIMD).
void read_rgb_scanlines(jpeg_decompress_struct* cinfo, Image* out) {
  constexpr JDIMENSION kRows = 8;  // more than the at most 4 rows libjpeg returns per call
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW rows[kRows];
    const JDIMENSION n = std::min(kRows, cinfo->output_height - cinfo->output_scanline);
    for (JDIMENSION i = 0; i < n; ++i) rows[i] = out->row(cinfo->output_scanline + i);
    jpeg_read_scanlines(cinfo, rows, n);
  }
}

// CMYK through one scratch row from libjpeg's own pool (freed with the decompressor).
void read_cmyk_scanlines(jpeg_decompress_struct* cinfo, Image* out) {
  const JDIMENSION width = cinfo->output_width;
  JSAMPARRAY scratch = cinfo->mem->alloc_sarray(reinterpret_cast<j_common_ptr>(cinfo),
                                                JPOOL_IMAGE, width * 4, 1);
  const bool inverted = cinfo->saw_Adobe_marker;
  while (cinfo->output_scanline < cinfo->output_height) {
    const JDIMENSION y = cinfo->output_scanline;
    jpeg_read_scanlines(cinfo, scratch, 1);
    cmyk_row_to_rgb(scratch[0], out->row(y), width, inverted);
  }
}

// The output colour space for the file's, or false for one with no RGB meaning.
bool choose_jpeg_output(jpeg_decompress_struct* cinfo) {
  switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
      cinfo->out_color_space = JCS_RGB;
      return true;
    case JCS_CMYK:
    case JCS_YCCK:
      cinfo->out_color_space = JCS_CMYK;
      return true;
    default:
      return false;
  }
}

// nullptr on success, kAboveLimit for an image above the limit (its size in `claimed`), else what
// went wrong. Only trivially destructible locals (see the top).
const char* decode_jpeg_into(jpeg_decompress_struct* cinfo, JpegErrorManager* err,
                             const uint8_t* data, size_t size, int64_t max_pixels, Claimed* claimed,
                             Image* out) {
  if (setjmp(err->jump)) return err->message;
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(cinfo, TRUE);
  // Before jpeg_start_decompress, which allocates a progressive file's whole-image coefficient
  // buffers, and before the image itself.
  *claimed = Claimed{cinfo->image_width, cinfo->image_height};
  if (!within_limit(*claimed, max_pixels)) return kAboveLimit;
  if (!choose_jpeg_output(cinfo)) {
    std::snprintf(err->message, sizeof(err->message),
                  "unsupported JPEG colour space (libjpeg J_COLOR_SPACE %d, %d components)",
                  static_cast<int>(cinfo->jpeg_color_space), cinfo->num_components);
    return err->message;
  }
  jpeg_start_decompress(cinfo);
  *out = Image(cinfo->output_height, cinfo->output_width, 3);
  if (cinfo->out_color_space == JCS_CMYK) {
    read_cmyk_scanlines(cinfo, out);
  } else {
    read_rgb_scanlines(cinfo, out);
  }
  jpeg_finish_decompress(cinfo);
  return nullptr;
}

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels) {
  JpegErrorManager err;
  init_jpeg_errors(err);
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof(cinfo));
  cinfo.err = &err.pub;
  JpegDecompressGuard guard{&cinfo};
  Image image;
  Claimed claimed;
  const char* failure = decode_jpeg_into(&cinfo, &err, data, size, max_pixels, &claimed, &image);
  if (failure == kAboveLimit) refuse_above_limit("JPEG", name, claimed, max_pixels);
  TORCH_CHECK(failure == nullptr, "JPEG image ", name, ": ", failure);
  return image;
}

// ---------------------------------------------------------------------------------------------
// PNG decoding

struct PngReadState {
  const uint8_t* data;
  size_t size;
  size_t offset;
  char message[256];
};

struct PngReadGuard {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReadGuard() {
    if (png) png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
  }
};

[[noreturn]] void png_fail(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngReadState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", message);
  png_longjmp(png, 1);
}

// libpng reports every problem with the pixels (bad CRC of IDAT, short or damaged data) as an
// error; its warnings concern ancillary chunks (an odd iCCP profile, a bad tEXt CRC) that
// decoding drops, and are common in real files, so they are ignored, and not printed.
void png_warn(png_structp, png_const_charp) {}

void png_read_memory(png_structp png, png_bytep dest, png_size_t length) {
  auto* state = static_cast<PngReadState*>(png_get_io_ptr(png));
  if (length > state->size - state->offset) png_error(png, "truncated file (unexpected end of data)");
  std::memcpy(dest, state->data + state->offset, length);
  state->offset += length;
}

// Every PNG to 8-bit RGB: palettes and 1/2/4-bit gray expanded, 16-bit samples scaled to the
// nearest 8-bit value, gray replicated, alpha (and tRNS transparency, never expanded) dropped.
void set_png_transforms(png_structp png, png_infop info) {
  const int color_type = png_get_color_type(png, info);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8) {
    png_set_expand_gray_1_2_4_to_8(png);
  }
  png_set_scale_16(png);
  if (!(color_type & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
  png_set_strip_alpha(png);
}

// nullptr on success, kAboveLimit for an image above the limit (its size in `claimed`), else what
// went wrong. Only trivially destructible locals (see the top).
const char* decode_png_into(PngReadGuard* guard, PngReadState* state, int64_t max_pixels,
                            Claimed* claimed, Image* out) {
  png_structp png = guard->png;
  if (setjmp(png_jmpbuf(png))) return state->message;
  png_set_read_fn(png, state, png_read_memory);
  png_read_info(png, guard->info);
  *claimed = Claimed{png_get_image_width(png, guard->info), png_get_image_height(png, guard->info)};
  if (!within_limit(*claimed, max_pixels)) return kAboveLimit;
  set_png_transforms(png, guard->info);
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, guard->info);
  const png_uint_32 width = png_get_image_width(png, guard->info);
  const png_uint_32 height = png_get_image_height(png, guard->info);
  if (png_get_rowbytes(png, guard->info) != size_t{width} * 3) {
    png_error(png, "unexpected row size after conversion to 8-bit RGB");
  }
  *out = Image(height, width, 3);
  for (int pass = 0; pass < passes; ++pass) {
    for (png_uint_32 y = 0; y < height; ++y) png_read_row(png, out->row(y), nullptr);
  }
  // Checks the last IDAT's CRC and that the file goes on to IEND: a cut file is an error.
  png_read_end(png, nullptr);
  return nullptr;
}

Image decode_png(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels) {
  PngReadState state{data, size, 0, {}};
  PngReadGuard guard;
  guard.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &state, png_fail, png_warn);
  TORCH_CHECK(guard.png != nullptr, "PNG image ", name, ": cannot create a libpng reader");
  guard.info = png_create_info_struct(guard.png);
  TORCH_CHECK(guard.info != nullptr, "PNG image ", name, ": cannot create a libpng reader");
  Image image;
  Claimed claimed;
  const char* failure = decode_png_into(&guard, &state, max_pixels, &claimed, &image);
  if (failure == kAboveLimit) refuse_above_limit("PNG", name, claimed, max_pixels);
  TORCH_CHECK(failure == nullptr, "PNG image ", name, ": ", failure);
  return image;
}

// ---------------------------------------------------------------------------------------------
// Files

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

// The raw bytes, in one read into a buffer of the file's size. Not data::detail's
// read_file_bytes: images are never gzip-compressed, and its zlib buffers (3 MiB) would cost
// more than a typical photo's decoding.
std::vector<uint8_t> read_raw_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);
  TORCH_CHECK(fs::exists(status), "image ", path, ": no such file");
  TORCH_CHECK(fs::is_regular_file(status), "image ", path, ": not a regular file");
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  TORCH_CHECK(file != nullptr, "image ", path, ": cannot open (", std::strerror(errno), ")");
  const auto size = static_cast<size_t>(fs::file_size(path, ec));
  TORCH_CHECK(!ec, "image ", path, ": cannot read its size (", ec.message(), ")");
  std::vector<uint8_t> bytes(size);
  const size_t got = size ? std::fread(bytes.data(), 1, size, file.get()) : 0;
  TORCH_CHECK(got == size, "image ", path, ": read ", got, " of its ", size, " bytes (",
              std::strerror(errno), ")");
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// Encoding (tests and generated benchmark data)

void check_encodable(const Image& image, const char* what) {
  TORCH_CHECK(image.height > 0 && image.width > 0, what, ": image ", image.height, "x",
              image.width, " is empty");
  const int64_t expected = image.height * image.width * image.channels;
  TORCH_CHECK(image.pixels.size() == static_cast<size_t>(expected), what, ": image holds ",
              image.pixels.size(), " bytes, expected height * width * channels = ", expected);
}

struct JpegCompressGuard {
  jpeg_compress_struct* cinfo;
  unsigned char** buffer;
  ~JpegCompressGuard() {
    jpeg_destroy_compress(cinfo);
    std::free(*buffer);  // jpeg_mem_dest's buffer is malloc'd, and ours to free
  }
};

// Photoshop's CMYK: the Adobe marker and 255 - ink in the file.
void write_inverted_scanlines(jpeg_compress_struct* cinfo, const Image* image) {
  JSAMPARRAY scratch = cinfo->mem->alloc_sarray(reinterpret_cast<j_common_ptr>(cinfo),
                                                JPOOL_IMAGE, cinfo->image_width * 4, 1);
  while (cinfo->next_scanline < cinfo->image_height) {
    const uint8_t* row = image->row(cinfo->next_scanline);
    for (JDIMENSION i = 0; i < cinfo->image_width * 4; ++i) scratch[0][i] = 255 - row[i];
    jpeg_write_scanlines(cinfo, scratch, 1);
  }
}

void write_scanlines(jpeg_compress_struct* cinfo, const Image* image) {
  while (cinfo->next_scanline < cinfo->image_height) {
    // libjpeg reads the input rows; JSAMPROW is non-const only for historical reasons.
    JSAMPROW row = const_cast<uint8_t*>(image->row(cinfo->next_scanline));
    jpeg_write_scanlines(cinfo, &row, 1);
  }
}

// nullptr on success, else what went wrong. Only trivially destructible locals (see the top).
const char* encode_jpeg_into(jpeg_compress_struct* cinfo, JpegErrorManager* err,
                             const Image* image, int quality, J_COLOR_SPACE stored,
                             unsigned char** buffer, unsigned long* size) {
  if (setjmp(err->jump)) return err->message;
  jpeg_create_compress(cinfo);
  jpeg_mem_dest(cinfo, buffer, size);
  cinfo->image_width = static_cast<JDIMENSION>(image->width);
  cinfo->image_height = static_cast<JDIMENSION>(image->height);
  cinfo->input_components = static_cast<int>(image->channels);
  const bool cmyk = image->channels == 4;
  cinfo->in_color_space = image->channels == 1 ? JCS_GRAYSCALE : cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_set_defaults(cinfo);
  jpeg_set_colorspace(cinfo, stored);
  if (cmyk) cinfo->write_Adobe_marker = TRUE;
  jpeg_set_quality(cinfo, quality, TRUE);
  jpeg_start_compress(cinfo, TRUE);
  if (cmyk) {
    write_inverted_scanlines(cinfo, image);
  } else {
    write_scanlines(cinfo, image);
  }
  jpeg_finish_compress(cinfo);
  return nullptr;
}

std::vector<uint8_t> encode_jpeg_as(const Image& image, int quality, J_COLOR_SPACE stored,
                                    const char* what) {
  TORCH_CHECK(quality >= 1 && quality <= 100, what, ": quality ", quality,
              " is outside [1, 100]");
  check_encodable(image, what);
  JpegErrorManager err;
  init_jpeg_errors(err);
  jpeg_compress_struct cinfo;
  std::memset(&cinfo, 0, sizeof(cinfo));
  cinfo.err = &err.pub;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  JpegCompressGuard guard{&cinfo, &buffer};
  const char* failure = encode_jpeg_into(&cinfo, &err, &image, quality, stored, &buffer, &size);
  TORCH_CHECK(failure == nullptr, what, ": ", failure);
  return std::vector<uint8_t>(buffer, buffer + size);
}

J_COLOR_SPACE stored_jpeg_space(int64_t channels) {
  TORCH_CHECK(channels == 1 || channels == 3 || channels == 4, "encode_jpeg: image has ",
              channels, " channels, expected 1 (gray), 3 (RGB) or 4 (CMYK)");
  return channels == 1 ? JCS_GRAYSCALE : channels == 3 ? JCS_YCbCr : JCS_CMYK;
}

struct PngWriteState {
  std::vector<uint8_t>* bytes;
  char message[256];
};

struct PngWriteGuard {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngWriteGuard() {
    if (png) png_destroy_write_struct(&png, info ? &info : nullptr);
  }
};

[[noreturn]] void png_write_fail(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngWriteState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", message);
  png_longjmp(png, 1);
}

// No C++ exception may cross libpng's C frames: running out of memory becomes a libpng error.
void png_write_memory(png_structp png, png_bytep data, png_size_t length) {
  auto* state = static_cast<PngWriteState*>(png_get_io_ptr(png));
  bool grown = true;
  try {
    state->bytes->insert(state->bytes->end(), data, data + length);
  } catch (const std::bad_alloc&) {
    grown = false;
  }
  if (!grown) png_error(png, "out of memory");
}

void png_flush_memory(png_structp) {}

// nullptr on success, else what went wrong. Only trivially destructible locals (see the top).
const char* encode_png_into(PngWriteGuard* guard, PngWriteState* state, const Image* image) {
  png_structp png = guard->png;
  if (setjmp(png_jmpbuf(png))) return state->message;
  png_set_write_fn(png, state, png_write_memory, png_flush_memory);
  const int color_type = image->channels == 1   ? PNG_COLOR_TYPE_GRAY
                         : image->channels == 3 ? PNG_COLOR_TYPE_RGB
                                                : PNG_COLOR_TYPE_RGB_ALPHA;
  png_set_IHDR(png, guard->info, static_cast<png_uint_32>(image->width),
               static_cast<png_uint_32>(image->height), 8, color_type, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, guard->info);
  for (int64_t y = 0; y < image->height; ++y) png_write_row(png, image->row(y));
  png_write_end(png, nullptr);
  return nullptr;
}

}  // namespace

ImageFormat sniff_format(const uint8_t* data, size_t size) {
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return ImageFormat::Jpeg;
  if (size >= sizeof(kPngMagic) && std::memcmp(data, kPngMagic, sizeof(kPngMagic)) == 0) {
    return ImageFormat::Png;
  }
  return ImageFormat::Unknown;
}

Image decode_image(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels) {
  TORCH_CHECK(max_pixels >= 1, "image ", name, ": max_pixels (max_image_pixels) must be >= 1, got ",
              max_pixels);
  TORCH_CHECK(size > 0, "image ", name, ": file is empty");
  switch (sniff_format(data, size)) {
    case ImageFormat::Jpeg:
      return decode_jpeg(data, size, name, max_pixels);
    case ImageFormat::Png:
      return decode_png(data, size, name, max_pixels);
    case ImageFormat::Unknown:
      break;
  }
  TORCH_CHECK(false, "image ", name, ": not a JPEG or PNG file (it starts with ",
              leading_bytes(data, size), "; JPEG starts with ff d8 ff, PNG with 89 50 4e 47)");
}

Image read_image(const std::string& path, int64_t max_pixels) {
  const auto bytes = read_raw_file(path);
  return decode_image(bytes.data(), bytes.size(), path, max_pixels);
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality) {
  return encode_jpeg_as(image, quality, stored_jpeg_space(image.channels), "encode_jpeg");
}

std::vector<uint8_t> encode_jpeg_ycck(const Image& image, int quality) {
  TORCH_CHECK(image.channels == 4, "encode_jpeg_ycck: image has ", image.channels,
              " channels, expected 4 (CMYK)");
  return encode_jpeg_as(image, quality, JCS_YCCK, "encode_jpeg_ycck");
}

std::vector<uint8_t> encode_png(const Image& image) {
  TORCH_CHECK(image.channels == 1 || image.channels == 3 || image.channels == 4,
              "encode_png: image has ", image.channels,
              " channels, expected 1 (gray), 3 (RGB) or 4 (RGBA)");
  check_encodable(image, "encode_png");
  std::vector<uint8_t> bytes;
  PngWriteState state{&bytes, {}};
  PngWriteGuard guard;
  guard.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &state, png_write_fail, png_warn);
  TORCH_CHECK(guard.png != nullptr, "encode_png: cannot create a libpng writer");
  guard.info = png_create_info_struct(guard.png);
  TORCH_CHECK(guard.info != nullptr, "encode_png: cannot create a libpng writer");
  const char* failure = encode_png_into(&guard, &state, &image);
  TORCH_CHECK(failure == nullptr, "encode_png: ", failure);
  return bytes;
}

}  // namespace convnn::data
