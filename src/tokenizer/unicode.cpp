#include "tokenizer/unicode.h"

#include <unicode/uchar.h>

#include <vector>

namespace dschat {
namespace tokenizer {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Letters and numbers assigned in Unicode 15.1 and 16.0. `tokenizers` matches with Oniguruma's
// Unicode 16.0 tables while Debian 12's ICU 72 knows Unicode 15.0, where these are unassigned;
// they are applied only to code points this ICU reports as unassigned. Found by classifying every
// code point with `tokenizers`' ByteLevel pre-tokenizer (see tests/tokenizer/classify_hf.py).
struct Assigned {
  char32_t first, last;
  uint8_t bits;
};
constexpr uint8_t kL = kLetter | kWord;
constexpr uint8_t kN = kNumber | kWord;
constexpr Assigned kNewerUnicode[] = {
    {0x1C89, 0x1C8A, kL},   {0xA7CB, 0xA7CD, kL},   {0xA7DA, 0xA7DC, kL},   {0x105C0, 0x105F3, kL},
    {0x10D40, 0x10D49, kN}, {0x10D4A, 0x10D65, kL}, {0x10D6F, 0x10D85, kL}, {0x10EC2, 0x10EC4, kL},
    {0x11380, 0x11389, kL}, {0x1138B, 0x1138B, kL}, {0x1138E, 0x1138E, kL}, {0x11390, 0x113B5, kL},
    {0x113B7, 0x113B7, kL}, {0x113D1, 0x113D1, kL}, {0x113D3, 0x113D3, kL}, {0x116D0, 0x116E3, kN},
    {0x11BC0, 0x11BE0, kL}, {0x11BF0, 0x11BF9, kN}, {0x13460, 0x143FA, kL}, {0x16100, 0x1611D, kL},
    {0x16130, 0x16139, kN}, {0x16D40, 0x16D6C, kL}, {0x16D70, 0x16D79, kN}, {0x18CFF, 0x18CFF, kL},
    {0x1CCF0, 0x1CCF9, kN}, {0x1E5D0, 0x1E5ED, kL}, {0x1E5F0, 0x1E5F0, kL}, {0x1E5F1, 0x1E5FA, kN},
    {0x2EBF0, 0x2EE5D, kL},
};

uint8_t compute_class(char32_t cp) {
  auto c = static_cast<UChar32>(cp);
  uint8_t bits = 0;
  int32_t mask = U_GET_GC_MASK(c);
  if (mask & U_GC_L_MASK) bits |= kLetter;
  if (mask & U_GC_N_MASK) bits |= kNumber;
  if (u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) bits |= kSpace;
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || (mask & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) ||
      u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) {
    bits |= kWord;
  }
  UVersionInfo age;
  u_charAge(c, age);
  if (age[0] > 11 || (age[0] == 11 && age[1] > 0)) bits |= kAfterUnicode11;
  return bits;
}

// One byte per code point (1.1 MB), built on first use; C++11 makes the initialisation thread-safe.
const std::vector<uint8_t>& class_table() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(kMaxCodePoint + 1);
    for (char32_t cp = 0; cp <= kMaxCodePoint; ++cp) t[cp] = compute_class(cp);
    for (const Assigned& range : kNewerUnicode) {
      for (char32_t cp = range.first; cp <= range.last; ++cp) {
        if (u_charType(static_cast<UChar32>(cp)) == U_UNASSIGNED) t[cp] = range.bits;
      }
    }
    return t;
  }();
  return table;
}

// Length of the well-formed prefix of the sequence at `pos` (Unicode Table 3-7), and whether the
// sequence is complete.
size_t valid_prefix(std::string_view text, size_t pos, bool* complete) {
  auto at = [&](size_t i) -> int { return i < text.size() ? static_cast<unsigned char>(text[i]) : -1; };
  int b0 = at(pos);
  *complete = false;
  if (b0 < 0x80) {
    *complete = true;
    return 1;
  }
  int need = 0, lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;  // a continuation byte, C0, C1 or F5..FF: never part of a well-formed sequence
  }
  size_t length = 1;
  for (int k = 0; k < need; ++k) {
    int b = at(pos + length);
    int low = k == 0 ? lo : 0x80, high = k == 0 ? hi : 0xBF;
    if (b < low || b > high) return length;
    ++length;
  }
  *complete = true;
  return length;
}

}  // namespace

uint8_t char_class(char32_t cp) { return cp <= kMaxCodePoint ? class_table()[cp] : 0; }

std::vector<std::pair<char32_t, char32_t>> newer_unicode_ranges(CharClass which) {
  std::vector<std::pair<char32_t, char32_t>> out;
  for (char32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
    if (!(char_class(cp) & which)) continue;
    // Unicode 15.0 additions carry ICU's age 15.0; 15.1/16.0 ones are unassigned to ICU (age 0).
    UVersionInfo age;
    u_charAge(static_cast<UChar32>(cp), age);
    bool newer = (age[0] == 0 && age[1] == 0) || age[0] > 14 || (age[0] == 14 && age[1] > 0);
    if (!newer) continue;
    if (!out.empty() && out.back().second + 1 == cp) {
      out.back().second = cp;
    } else {
      out.emplace_back(cp, cp);
    }
  }
  return out;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t find_invalid_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    bool complete = false;
    size_t length = valid_prefix(text, pos, &complete);
    if (!complete) return pos;
    pos += length;
  }
  return std::string_view::npos;
}

std::string to_valid_utf8(std::string_view text) {
  size_t first_bad = find_invalid_utf8(text);
  if (first_bad == std::string_view::npos) return std::string(text);
  std::string out(text.substr(0, first_bad));
  size_t pos = first_bad;
  while (pos < text.size()) {
    bool complete = false;
    size_t length = valid_prefix(text, pos, &complete);
    if (complete) {
      out.append(text.substr(pos, length));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    pos += length;
  }
  return out;
}

size_t count_code_points(std::string_view text) {
  size_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace tokenizer
}  // namespace dschat
