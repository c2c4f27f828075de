#include "tokenizer/pretokenize_gpt2.h"

#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

enum class Kind { kLetter, kNumber, kSpace, kOther };

Kind kind_of(char32_t cp) {
  if (cp < 0x80) {
    // ASCII fast path; the same answers as the table.
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return Kind::kLetter;
    if (cp >= '0' && cp <= '9') return Kind::kNumber;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return Kind::kSpace;
    return Kind::kOther;
  }
  uint8_t bits = char_class(cp);
  if (bits & kLetter) return Kind::kLetter;
  if (bits & kNumber) return Kind::kNumber;
  if (bits & kSpace) return Kind::kSpace;
  return Kind::kOther;
}

// Length of a contraction ('s 't 'm 'd 're 've 'll, lowercase ASCII only) at `pos`, or 0.
size_t contraction_length(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  char c1 = text[pos + 1];
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  char c2 = text[pos + 2];
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// End of the run of code points of kind `kind` that starts at `pos`.
size_t run_end(std::string_view text, size_t pos, Kind kind) {
  size_t n = text.size();
  while (pos < n) {
    size_t next = pos;
    if (kind_of(next_code_point(text, next)) != kind) break;
    pos = next;
  }
  return pos;
}

}  // namespace

void split_gpt2(std::string_view text, std::vector<Span>& out) {
  size_t n = text.size();
  size_t pos = 0;
  while (pos < n) {
    size_t start = pos;
    if (size_t len = contraction_length(text, pos)) {
      out.emplace_back(start, start + len);
      pos = start + len;
      continue;
    }
    size_t next = pos;
    char32_t cp = next_code_point(text, next);
    Kind kind = kind_of(cp);
    if (kind == Kind::kSpace) {
      // ' ?X+' alternatives: a single U+0020 joins the letter, number or symbol run after it.
      if (cp == ' ' && next < n) {
        size_t after = next;
        Kind next_kind = kind_of(next_code_point(text, after));
        if (next_kind != Kind::kSpace) {
          pos = run_end(text, after, next_kind);
          out.emplace_back(start, pos);
          continue;
        }
      }
      // \s+(?!\S) backs off one code point when the run is followed by a non-space; a run of one
      // code point then falls through to \s+.
      size_t last = start;
      size_t end = next;
      while (end < n) {
        size_t after = end;
        if (kind_of(next_code_point(text, after)) != Kind::kSpace) break;
        last = end;
        end = after;
      }
      pos = (end < n && last > start) ? last : end;
      out.emplace_back(start, pos);
      continue;
    }
    pos = run_end(text, next, kind);
    out.emplace_back(start, pos);
  }
}

}  // namespace tokenizer
}  // namespace dschat
