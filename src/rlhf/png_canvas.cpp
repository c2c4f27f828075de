#include "rlhf/png_canvas.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>

#include "dschat/core/error.h"
#include "io/atomic_file.h"

namespace dschat {
namespace rlhf {
namespace {

// The classic 5x7 LCD font for ASCII 0x20..0x7E: five column bytes per glyph, bit 0 = top row.
constexpr uint8_t kFont5x7[95][5] = {
    {0x00, 0x00, 0x00, 0x00, 0x00}, {0x00, 0x00, 0x5F, 0x00, 0x00}, {0x00, 0x07, 0x00, 0x07, 0x00},  // ' ' ! "
    {0x14, 0x7F, 0x14, 0x7F, 0x14}, {0x24, 0x2A, 0x7F, 0x2A, 0x12}, {0x23, 0x13, 0x08, 0x64, 0x62},  // # $ %
    {0x36, 0x49, 0x55, 0x22, 0x50}, {0x00, 0x05, 0x03, 0x00, 0x00}, {0x00, 0x1C, 0x22, 0x41, 0x00},  // & ' (
    {0x00, 0x41, 0x22, 0x1C, 0x00}, {0x08, 0x2A, 0x1C, 0x2A, 0x08}, {0x08, 0x08, 0x3E, 0x08, 0x08},  // ) * +
    {0x00, 0x50, 0x30, 0x00, 0x00}, {0x08, 0x08, 0x08, 0x08, 0x08}, {0x00, 0x60, 0x60, 0x00, 0x00},  // , - .
    {0x20, 0x10, 0x08, 0x04, 0x02}, {0x3E, 0x51, 0x49, 0x45, 0x3E}, {0x00, 0x42, 0x7F, 0x40, 0x00},  // / 0 1
    {0x42, 0x61, 0x51, 0x49, 0x46}, {0x21, 0x41, 0x45, 0x4B, 0x31}, {0x18, 0x14, 0x12, 0x7F, 0x10},  // 2 3 4
    {0x27, 0x45, 0x45, 0x45, 0x39}, {0x3C, 0x4A, 0x49, 0x49, 0x30}, {0x01, 0x71, 0x09, 0x05, 0x03},  // 5 6 7
    {0x36, 0x49, 0x49, 0x49, 0x36}, {0x06, 0x49, 0x49, 0x29, 0x1E}, {0x00, 0x36, 0x36, 0x00, 0x00},  // 8 9 :
    {0x00, 0x56, 0x36, 0x00, 0x00}, {0x08, 0x14, 0x22, 0x41, 0x00}, {0x14, 0x14, 0x14, 0x14, 0x14},  // ; < =
    {0x00, 0x41, 0x22, 0x14, 0x08}, {0x02, 0x01, 0x51, 0x09, 0x06}, {0x32, 0x49, 0x79, 0x41, 0x3E},  // > ? @
    {0x7E, 0x11, 0x11, 0x11, 0x7E}, {0x7F, 0x49, 0x49, 0x49, 0x36}, {0x3E, 0x41, 0x41, 0x41, 0x22},  // A B C
    {0x7F, 0x41, 0x41, 0x22, 0x1C}, {0x7F, 0x49, 0x49, 0x49, 0x41}, {0x7F, 0x09, 0x09, 0x01, 0x01},  // D E F
    {0x3E, 0x41, 0x41, 0x51, 0x32}, {0x7F, 0x08, 0x08, 0x08, 0x7F}, {0x00, 0x41, 0x7F, 0x41, 0x00},  // G H I
    {0x20, 0x40, 0x41, 0x3F, 0x01}, {0x7F, 0x08, 0x14, 0x22, 0x41}, {0x7F, 0x40, 0x40, 0x40, 0x40},  // J K L
    {0x7F, 0x02, 0x04, 0x02, 0x7F}, {0x7F, 0x04, 0x08, 0x10, 0x7F}, {0x3E, 0x41, 0x41, 0x41, 0x3E},  // M N O
    {0x7F, 0x09, 0x09, 0x09, 0x06}, {0x3E, 0x41, 0x51, 0x21, 0x5E}, {0x7F, 0x09, 0x19, 0x29, 0x46},  // P Q R
    {0x46, 0x49, 0x49, 0x49, 0x31}, {0x01, 0x01, 0x7F, 0x01, 0x01}, {0x3F, 0x40, 0x40, 0x40, 0x3F},  // S T U
    {0x1F, 0x20, 0x40, 0x20, 0x1F}, {0x7F, 0x20, 0x18, 0x20, 0x7F}, {0x63, 0x14, 0x08, 0x14, 0x63},  // V W X
    {0x03, 0x04, 0x78, 0x04, 0x03}, {0x61, 0x51, 0x49, 0x45, 0x43}, {0x00, 0x7F, 0x41, 0x41, 0x00},  // Y Z [
    {0x02, 0x04, 0x08, 0x10, 0x20}, {0x00, 0x41, 0x41, 0x7F, 0x00}, {0x04, 0x02, 0x01, 0x02, 0x04},  // \ ] ^
    {0x40, 0x40, 0x40, 0x40, 0x40}, {0x00, 0x01, 0x02, 0x04, 0x00}, {0x20, 0x54, 0x54, 0x54, 0x78},  // _ ` a
    {0x7F, 0x48, 0x44, 0x44, 0x38}, {0x38, 0x44, 0x44, 0x44, 0x20}, {0x38, 0x44, 0x44, 0x48, 0x7F},  // b c d
    {0x38, 0x54, 0x54, 0x54, 0x18}, {0x08, 0x7E, 0x09, 0x01, 0x02}, {0x08, 0x54, 0x54, 0x54, 0x3C},  // e f g
    {0x7F, 0x08, 0x04, 0x04, 0x78}, {0x00, 0x44, 0x7D, 0x40, 0x00}, {0x20, 0x40, 0x44, 0x3D, 0x00},  // h i j
    {0x7F, 0x10, 0x28, 0x44, 0x00}, {0x00, 0x41, 0x7F, 0x40, 0x00}, {0x7C, 0x04, 0x18, 0x04, 0x78},  // k l m
    {0x7C, 0x08, 0x04, 0x04, 0x78}, {0x38, 0x44, 0x44, 0x44, 0x38}, {0x7C, 0x14, 0x14, 0x14, 0x08},  // n o p
    {0x08, 0x14, 0x14, 0x18, 0x7C}, {0x7C, 0x08, 0x04, 0x04, 0x08}, {0x48, 0x54, 0x54, 0x54, 0x20},  // q r s
    {0x04, 0x3F, 0x44, 0x40, 0x20}, {0x3C, 0x40, 0x40, 0x20, 0x7C}, {0x1C, 0x20, 0x40, 0x20, 0x1C},  // t u v
    {0x3C, 0x40, 0x30, 0x40, 0x3C}, {0x44, 0x28, 0x10, 0x28, 0x44}, {0x0C, 0x50, 0x50, 0x50, 0x3C},  // w x y
    {0x44, 0x64, 0x54, 0x4C, 0x44}, {0x00, 0x08, 0x36, 0x41, 0x00}, {0x00, 0x00, 0x7F, 0x00, 0x00},  // z { |
    {0x00, 0x41, 0x36, 0x08, 0x00}, {0x10, 0x08, 0x08, 0x10, 0x08},                                  // } ~
};

std::array<uint32_t, 256> make_crc32_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;  // reflected 0x04C11DB7
    table[i] = c;
  }
  return table;
}

void put_be32(std::string& out, uint32_t v) {
  const char bytes[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                         static_cast<char>(v)};
  out.append(bytes, 4);
}

// One PNG chunk: length (BE), type, data, CRC-32 of type + data (BE).
void put_chunk(std::string& out, const char type[4], const std::string& data) {
  put_be32(out, static_cast<uint32_t>(data.size()));
  const size_t crc_from = out.size();
  out.append(type, 4);
  out += data;
  put_be32(out, crc32(out.data() + crc_from, out.size() - crc_from));
}

}  // namespace

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_crc32_table();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t a = 1, b = 0;
  while (n > 0) {
    // 5552 bytes is the most that keeps b below 2^32 before the modulo (zlib's NMAX).
    const size_t block = std::min<size_t>(n, 5552);
    for (size_t i = 0; i < block; ++i) {
      a += p[i];
      b += a;
    }
    a %= 65521;
    b %= 65521;
    p += block;
    n -= block;
  }
  return (b << 16) | a;
}

std::string zlib_store(const std::string& data) {
  std::string out;
  out.reserve(data.size() + data.size() / 65535 * 5 + 16);
  out += '\x78';  // CMF: deflate, 32 KiB window
  out += '\x01';  // FLG: no dictionary, fastest level; (0x78 << 8 | 0x01) % 31 == 0
  size_t pos = 0;
  do {
    const size_t len = std::min<size_t>(data.size() - pos, 65535);
    const bool last = pos + len == data.size();
    // Block header: BFINAL bit + BTYPE 00 (stored), padded to the byte; then LEN and ~LEN (LE).
    out += static_cast<char>(last ? 1 : 0);
    out += static_cast<char>(len & 0xFF);
    out += static_cast<char>(len >> 8);
    out += static_cast<char>(~len & 0xFF);
    out += static_cast<char>((~len >> 8) & 0xFF);
    out.append(data, pos, len);
    pos += len;
  } while (pos < data.size());
  put_be32(out, adler32(data.data(), data.size()));
  return out;
}

PngCanvas::PngCanvas(int width, int height, Rgb background) : width_(width), height_(height) {
  DSCHAT_CHECK(width >= 1 && width <= 16384 && height >= 1 && height <= 16384, InvalidArgument,
               "PngCanvas: size ", width, "x", height, " is outside 1..16384 pixels");
  rgb_.resize(static_cast<size_t>(width) * height * 3);
  for (size_t i = 0; i < rgb_.size(); i += 3) {
    rgb_[i] = background.r;
    rgb_[i + 1] = background.g;
    rgb_[i + 2] = background.b;
  }
}

void PngCanvas::set_pixel(int x, int y, Rgb colour) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  uint8_t* p = &rgb_[(static_cast<size_t>(y) * width_ + x) * 3];
  p[0] = colour.r;
  p[1] = colour.g;
  p[2] = colour.b;
}

Rgb PngCanvas::pixel(int x, int y) const {
  DSCHAT_CHECK(x >= 0 && y >= 0 && x < width_ && y < height_, InvalidArgument, "PngCanvas::pixel: (", x, ", ",
               y, ") is outside the ", width_, "x", height_, " canvas");
  const uint8_t* p = &rgb_[(static_cast<size_t>(y) * width_ + x) * 3];
  return Rgb{p[0], p[1], p[2]};
}

void PngCanvas::fill_rect(int x0, int y0, int x1, int y1, Rgb colour) {
  if (x0 > x1) std::swap(x0, x1);
  if (y0 > y1) std::swap(y0, y1);
  x0 = std::max(x0, 0);
  y0 = std::max(y0, 0);
  x1 = std::min(x1, width_ - 1);
  y1 = std::min(y1, height_ - 1);
  for (int y = y0; y <= y1; ++y) {
    for (int x = x0; x <= x1; ++x) set_pixel(x, y, colour);
  }
}

void PngCanvas::draw_rect(int x0, int y0, int x1, int y1, Rgb colour) {
  fill_rect(x0, y0, x1, y0, colour);
  fill_rect(x0, y1, x1, y1, colour);
  fill_rect(x0, y0, x0, y1, colour);
  fill_rect(x1, y0, x1, y1, colour);
}

void PngCanvas::draw_line(double x0, double y0, double x1, double y1, Rgb colour, int thickness) {
  if (!std::isfinite(x0) || !std::isfinite(y0) || !std::isfinite(x1) || !std::isfinite(y1)) return;
  // Clamp far-off end points so the integer walk stays short (callers clip to their plot area).
  const double limit = 4.0 * (width_ + height_);
  auto clamp = [limit](double v) { return std::max(-limit, std::min(limit, v)); };
  int xa = static_cast<int>(std::lround(clamp(x0))), ya = static_cast<int>(std::lround(clamp(y0)));
  const int xb = static_cast<int>(std::lround(clamp(x1))), yb = static_cast<int>(std::lround(clamp(y1)));
  const int dx = std::abs(xb - xa), sx = xa < xb ? 1 : -1;
  const int dy = -std::abs(yb - ya), sy = ya < yb ? 1 : -1;
  const int lo = -(std::max(thickness, 1) - 1) / 2, hi = lo + std::max(thickness, 1) - 1;
  int err = dx + dy;
  while (true) {
    fill_rect(xa + lo, ya + lo, xa + hi, ya + hi, colour);
    if (xa == xb && ya == yb) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      xa += sx;
    }
    if (e2 <= dx) {
      err += dx;
      ya += sy;
    }
  }
}

void PngCanvas::draw_text(int x, int y, const std::string& text, Rgb colour, int scale) {
  scale = std::max(scale, 1);
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c > 0x7E) c = '?';
    const uint8_t* glyph = kFont5x7[c - 0x20];
    const int gx = x + static_cast<int>(i) * 6 * scale;
    for (int col = 0; col < 5; ++col) {
      for (int row = 0; row < 7; ++row) {
        if (glyph[col] & (1u << row)) {
          fill_rect(gx + col * scale, y + row * scale, gx + (col + 1) * scale - 1, y + (row + 1) * scale - 1, colour);
        }
      }
    }
  }
}

std::string PngCanvas::encode_png() const {
  // Raw image: each row is filter type 0 (None) followed by width * RGB bytes.
  const size_t row_bytes = static_cast<size_t>(width_) * 3;
  std::string raw;
  raw.reserve((row_bytes + 1) * height_);
  for (int y = 0; y < height_; ++y) {
    raw += '\0';
    raw.append(reinterpret_cast<const char*>(&rgb_[y * row_bytes]), row_bytes);
  }
  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_be32(ihdr, static_cast<uint32_t>(width_));
  put_be32(ihdr, static_cast<uint32_t>(height_));
  ihdr += '\x08';  // bit depth
  ihdr += '\x02';  // colour type: truecolour (RGB)
  ihdr += '\0';    // compression: deflate
  ihdr += '\0';    // filter method 0
  ihdr += '\0';    // no interlace
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", zlib_store(raw));
  put_chunk(png, "IEND", std::string());
  return png;
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

}  // namespace rlhf
}  // namespace dschat
