#pragma once
// A tiny RGB raster for `dschat plot`: clipped pixels, lines, rectangles, ASCII text in a built-in
// 5x7 bitmap font, encoded as an 8-bit RGB PNG by libpng (png_encode.cpp). Coordinates: (0, 0) is
// the top-left pixel, y grows downwards.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace dschat {
namespace monitor {

struct Rgb {
  uint8_t r = 0;
  uint8_t g = 0;
  uint8_t b = 0;
};
inline bool operator==(Rgb a, Rgb b) { return a.r == b.r && a.g == b.g && a.b == b.b; }

/// Colours of the plot (matplotlib's "tab" palette, so the curves look familiar).
namespace palette {
constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kBlack{0, 0, 0};
constexpr Rgb kGrid{225, 225, 225};
constexpr Rgb kAxis{90, 90, 90};
constexpr Rgb kBlue{31, 119, 180};
constexpr Rgb kOrange{255, 127, 14};
constexpr Rgb kGreen{44, 160, 44};
constexpr Rgb kRed{214, 39, 40};
}  // namespace palette

class PngCanvas {
 public:
  /// Throws core::InvalidArgument unless 1 <= width, height <= 16384.
  PngCanvas(int width, int height, Rgb background = palette::kWhite);

  int width() const { return width_; }
  int height() const { return height_; }

  /// Pixels outside the canvas are ignored (drawing clips instead of failing).
  void set_pixel(int x, int y, Rgb colour);
  /// Throws core::InvalidArgument outside the canvas.
  Rgb pixel(int x, int y) const;

  /// Fills the rectangle with corners (x0, y0) and (x1, y1), both inclusive, clipped.
  void fill_rect(int x0, int y0, int x1, int y1, Rgb colour);
  /// The 1-pixel outline of the same rectangle.
  void draw_rect(int x0, int y0, int x1, int y1, Rgb colour);
  /// A straight line (Bresenham) between the rounded end points, `thickness` pixels wide.
  void draw_line(double x0, double y0, double x1, double y1, Rgb colour, int thickness = 1);

  /// Draws `text` with its top-left corner at (x, y); each glyph is 5x7 pixels on a 6-pixel
  /// advance, magnified `scale` times. Characters outside printable ASCII are drawn as '?'.
  void draw_text(int x, int y, const std::string& text, Rgb colour, int scale = 1);
  static int text_width(const std::string& text, int scale = 1) {
    return static_cast<int>(text.size()) * 6 * scale;
  }
  static int text_height(int scale = 1) { return 7 * scale; }

  /// The whole PNG file (zlib-compressed, unfiltered rows). Throws core::IoError if libpng fails.
  std::string encode_png() const;
  /// Writes encode_png() atomically (temp file + rename), creating the parent directory.
  /// Throws core::IoError naming the file.
  void write_png(const std::filesystem::path& file) const;

 private:
  int width_;
  int height_;
  std::vector<uint8_t> rgb_;  // [height, width, 3] row-major
};

}  // namespace monitor
}  // namespace dschat
