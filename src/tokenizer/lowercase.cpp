#include "tokenizer/lowercase.h"

#include <unicode/uchar.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include "dschat/core/error.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

// Uppercase letters whose lowercase Unicode 16.0/17.0 added; `tokenizers` is built with a Rust
// whose tables have them and ICU 72 (Unicode 15.0) does not. Found by lowercasing every code
// point with `tokenizers` (tests/tokenizer/lowercase_hf.py); [first, last] maps to
// to_first + (cp - first).
struct NewerMapping {
  char32_t first, last, to_first;
};
constexpr NewerMapping kNewerLowercase[] = {
    {0x1C89, 0x1C89, 0x1C8A},   {0xA7CB, 0xA7CB, 0x0264},   {0xA7CC, 0xA7CC, 0xA7CD}, {0xA7CE, 0xA7CE, 0xA7CF},
    {0xA7D2, 0xA7D2, 0xA7D3},   {0xA7D4, 0xA7D4, 0xA7D5},   {0xA7DA, 0xA7DA, 0xA7DB}, {0xA7DC, 0xA7DC, 0x019B},
    {0x10D50, 0x10D65, 0x10D70}, {0x16EA0, 0x16EB8, 0x16EBB},
};

void append_lowercase(char32_t cp, std::string& out) {
  for (const NewerMapping& mapping : kNewerLowercase) {
    if (cp >= mapping.first && cp <= mapping.last) {
      append_utf8(mapping.to_first + (cp - mapping.first), out);
      return;
    }
  }
  // Full (not simple) mapping of the code point alone, root locale: u_strToLower on a one-code-
  // point string has no context for Final_Sigma or language rules to apply.
  UChar source[2];
  int32_t source_length = 0;
  U16_APPEND_UNSAFE(source, source_length, static_cast<UChar32>(cp));
  UChar lowered[8];
  UErrorCode status = U_ZERO_ERROR;
  int32_t length = u_strToLower(lowered, 8, source, source_length, "", &status);
  DSCHAT_CHECK(U_SUCCESS(status), InvalidArgument, "Lowercase: ICU failed on U+", static_cast<uint32_t>(cp), ": ",
               u_errorName(status));
  for (int32_t i = 0; i < length;) {
    UChar32 c;
    U16_NEXT_UNSAFE(lowered, i, c);
    append_utf8(static_cast<char32_t>(c), out);
  }
}

}  // namespace

void lowercase_utf8(std::string& text) {
  size_t first_non_ascii = 0;
  while (first_non_ascii < text.size() && static_cast<unsigned char>(text[first_non_ascii]) < 0x80) {
    char& c = text[first_non_ascii++];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  if (first_non_ascii == text.size()) return;
  std::string out(text, 0, first_non_ascii);
  out.reserve(text.size() + 8);
  size_t pos = first_non_ascii;
  while (pos < text.size()) {
    unsigned char b = static_cast<unsigned char>(text[pos]);
    if (b < 0x80) {
      out.push_back(b >= 'A' && b <= 'Z' ? static_cast<char>(b - 'A' + 'a') : static_cast<char>(b));
      ++pos;
      continue;
    }
    append_lowercase(next_code_point(text, pos), out);
  }
  text = std::move(out);
}

}  // namespace tokenizer
}  // namespace dschat
