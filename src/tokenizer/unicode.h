#pragma once
// UTF-8 and Unicode character classes for the tokenizer. The classes come from ICU and are kept in
// one table indexed by code point, so the pre-tokenizer's inner loop is a load and a bit test.
// The class definitions follow the regex engines of Hugging Face `tokenizers`:
//   letter   \p{L}   general category Lu Ll Lt Lm Lo
//   number   \p{N}   general category Nd Nl No
//   space    \s      Unicode White_Space (25 code points, U+0085 and U+00A0 included, U+200B not)
//   word     \w      Alphabetic, marks, Nd, Pc, Join_Control (Rust regex's Unicode \w)

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dschat {
namespace tokenizer {

enum CharClass : uint8_t {
  kLetter = 1,
  kNumber = 2,
  kSpace = 4,
  kWord = 8,
  // Assigned after Unicode 11.0, the version of `tokenizers`' normalization tables (NFC, NFKC...)
  kAfterUnicode11 = 16,
};

/// The CharClass bits of code point `cp` (0 for values above U+10FFFF).
uint8_t char_class(char32_t cp);

/// The letters (kLetter) or numbers (kNumber) of this table that Unicode 15.0, 15.1 or 16.0
/// assigned: Debian 12's Oniguruma 6.9.8 has Unicode 14.0 tables, so the regex engine adds these
/// to \p{L} and \p{N} to classify as `tokenizers`' Oniguruma (Unicode 16.0) does. Computed on
/// each call (a pass over all code points): callers keep the result.
std::vector<std::pair<char32_t, char32_t>> newer_unicode_ranges(CharClass which);

/// Decodes one code point of valid UTF-8 at `text[pos]`, advancing `pos`. The text must be valid
/// UTF-8 (see to_valid_utf8); no checks are made here.
inline char32_t next_code_point(std::string_view text, size_t& pos) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char b0 = byte(pos);
  if (b0 < 0x80) {
    pos += 1;
    return b0;
  }
  if (b0 < 0xE0) {
    char32_t cp = ((b0 & 0x1Fu) << 6) | (byte(pos + 1) & 0x3Fu);
    pos += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    char32_t cp = ((b0 & 0x0Fu) << 12) | ((byte(pos + 1) & 0x3Fu) << 6) | (byte(pos + 2) & 0x3Fu);
    pos += 3;
    return cp;
  }
  char32_t cp = ((b0 & 0x07u) << 18) | ((byte(pos + 1) & 0x3Fu) << 12) |
                ((byte(pos + 2) & 0x3Fu) << 6) | (byte(pos + 3) & 0x3Fu);
  pos += 4;
  return cp;
}

/// Byte length of the code point that starts with lead byte `b0` of valid UTF-8.
inline size_t utf8_length(unsigned char b0) { return b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4; }

/// Appends the UTF-8 encoding of `cp` to `out`.
void append_utf8(char32_t cp, std::string& out);

/// Offset of the first byte that does not start a well-formed UTF-8 sequence, or npos.
size_t find_invalid_utf8(std::string_view text);

/// `text` with each maximal ill-formed subsequence replaced by U+FFFD: the Unicode "substitution
/// of maximal subparts" practice, the same as Python's bytes.decode("utf-8", "replace") and
/// Rust's String::from_utf8_lossy.
std::string to_valid_utf8(std::string_view text);

/// Number of code points of valid UTF-8.
size_t count_code_points(std::string_view text);

}  // namespace tokenizer
}  // namespace dschat
