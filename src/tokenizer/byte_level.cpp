#include "tokenizer/byte_level.h"

#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

constexpr char32_t kAlphabetEnd = 0x144;  // every mapped code point is below this

struct Tables {
  std::array<char32_t, 256> char_of_byte{};
  std::array<std::string, 256> utf8_of_byte;
  std::array<int16_t, kAlphabetEnd> byte_of_char{};
};

bool printable(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

const Tables& tables() {
  static const Tables t = [] {
    Tables t;
    t.byte_of_char.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = printable(b) ? static_cast<char32_t>(b) : next++;
      t.char_of_byte[b] = cp;
      append_utf8(cp, t.utf8_of_byte[b]);
      t.byte_of_char[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return t;
}

}  // namespace

char32_t byte_to_char(uint8_t b) { return tables().char_of_byte[b]; }

void append_byte_level(std::string_view bytes, std::string& out) {
  const Tables& t = tables();
  for (char c : bytes) out += t.utf8_of_byte[static_cast<uint8_t>(c)];
}

void append_byte_level_decoded(std::string_view token, std::string& out) {
  const Tables& t = tables();
  size_t start = out.size();
  size_t pos = 0;
  while (pos < token.size()) {
    char32_t cp = next_code_point(token, pos);
    int b = cp < kAlphabetEnd ? t.byte_of_char[cp] : -1;
    if (b < 0) {
      out.resize(start);
      out.append(token);
      return;
    }
    out.push_back(static_cast<char>(b));
  }
}

}  // namespace tokenizer
}  // namespace dschat
