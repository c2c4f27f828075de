// PngCanvas's encoder: libpng (zlib-compressed IDAT), written to memory, then to the file
// atomically so a crashed `dschat plot` never leaves half an image.
#include <png.h>

#include <csetjmp>
#include <cstring>

#include "dschat/core/error.h"
#include "io/atomic_file.h"
#include "monitor/png_canvas.h"

namespace dschat {
namespace monitor {
namespace {

struct PngOutput {
  std::string bytes;
  char error[256] = {0};
};

void append_bytes(png_structp png, png_bytep data, png_size_t size) {
  static_cast<PngOutput*>(png_get_io_ptr(png))->bytes.append(reinterpret_cast<const char*>(data), size);
}

void flush_nothing(png_structp) {}

// libpng reports errors by calling this and expecting it not to return: keep the message and
// jump back to encode_rows' setjmp (no C++ object lives between the two).
[[noreturn]] void on_png_error(png_structp png, png_const_charp message) {
  auto* out = static_cast<PngOutput*>(png_get_error_ptr(png));
  std::strncpy(out->error, message, sizeof(out->error) - 1);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}

// 8-bit RGB rows [height, width * 3] into out->bytes; false with out->error set on failure.
bool encode_rows(const uint8_t* rgb, int width, int height, PngOutput* out) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, out, on_png_error, on_png_warning);
  if (png == nullptr) {
    std::strncpy(out->error, "png_create_write_struct failed", sizeof(out->error) - 1);
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    if (out->error[0] == '\0') std::strncpy(out->error, "png_create_info_struct failed", sizeof(out->error) - 1);
    return false;
  }
  png_set_write_fn(png, out, append_bytes, flush_nothing);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  // Plots are flat colours: unfiltered rows already compress to a few percent of their size, and
  // every decoder reads filter 0 without arithmetic.
  png_set_filter(png, PNG_FILTER_TYPE_BASE, PNG_FILTER_NONE);
  png_set_compression_level(png, 9);
  // One IDAT for images up to 1 MiB compressed (libpng's default splits at 8 KiB).
  png_set_compression_buffer_size(png, 1 << 20);
  png_write_info(png, info);
  const size_t row_bytes = static_cast<size_t>(width) * 3;
  for (int y = 0; y < height; ++y) png_write_row(png, rgb + static_cast<size_t>(y) * row_bytes);
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return true;
}

}  // namespace

std::string PngCanvas::encode_png() const {
  PngOutput out;
  const bool ok = encode_rows(rgb_.data(), width_, height_, &out);
  DSCHAT_CHECK(ok, IoError, "PngCanvas: libpng could not encode the ", width_, "x", height_, " image: ", out.error);
  return std::move(out.bytes);
}

void PngCanvas::write_png(const std::filesystem::path& file) const {
  const std::filesystem::path parent = file.parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    DSCHAT_CHECK(!ec, IoError, file.string(), ": cannot create directory ", parent.string(), ": ", ec.message());
  }
  io::write_file_atomically(file, encode_png());
}

}  // namespace monitor
}  // namespace dschat
