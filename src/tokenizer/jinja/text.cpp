// UTF-8 text as Python's str sees it (value.h): code points, str.isspace(), str.strip().
#include <algorithm>

#include "tokenizer/jinja/value.h"

namespace dschat {
namespace tokenizer {
namespace jinja {

std::vector<uint32_t> code_points(const std::string& text) {
  std::vector<uint32_t> points;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t length = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t point = length == 1 ? c : length == 2 ? (c & 0x1F) : length == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < length && i + k < text.size(); ++k) point = (point << 6) | (text[i + k] & 0x3F);
    points.push_back(point);
    i += length;
  }
  return points;
}

std::string utf8(const std::vector<uint32_t>& points) {
  std::string out;
  for (uint32_t p : points) {
    if (p < 0x80) {
      out += static_cast<char>(p);
    } else if (p < 0x800) {
      out += static_cast<char>(0xC0 | (p >> 6));
      out += static_cast<char>(0x80 | (p & 0x3F));
    } else if (p < 0x10000) {
      out += static_cast<char>(0xE0 | (p >> 12));
      out += static_cast<char>(0x80 | ((p >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (p & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (p >> 18));
      out += static_cast<char>(0x80 | ((p >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((p >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (p & 0x3F));
    }
  }
  return out;
}

bool is_space(uint32_t p) {
  return (p >= 0x09 && p <= 0x0D) || (p >= 0x1C && p <= 0x20) || p == 0x85 || p == 0xA0 || p == 0x1680 ||
         (p >= 0x2000 && p <= 0x200A) || p == 0x2028 || p == 0x2029 || p == 0x202F || p == 0x205F || p == 0x3000;
}

std::string strip(const std::string& text, bool left, bool right, const std::string* chars) {
  const std::vector<uint32_t> points = code_points(text);
  const std::vector<uint32_t> set = chars ? code_points(*chars) : std::vector<uint32_t>{};
  const auto strippable = [&](uint32_t p) {
    return chars ? std::find(set.begin(), set.end(), p) != set.end() : is_space(p);
  };
  size_t begin = 0, end = points.size();
  if (left) {
    while (begin < end && strippable(points[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strippable(points[end - 1])) --end;
  }
  return utf8(std::vector<uint32_t>(points.begin() + static_cast<std::ptrdiff_t>(begin),
                                    points.begin() + static_cast<std::ptrdiff_t>(end)));
}

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
