#include "tokenizer/split_pre_tokenizers.h"

#include <unicode/uchar.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dschat/core/error.h"
#include "tokenizer/split.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

// Rust's char::is_numeric (general category N), which Digits uses: \p{N} as `tokenizers`' regex
// engine sees it (Unicode 16.0, see unicode.h) plus the numbers Unicode 17.0 added, which the
// Rust standard library `tokenizers` is built with already knows.
bool is_numeric(char32_t cp) {
  return (char_class(cp) & kNumber) || (cp >= 0x11DE0 && cp <= 0x11DE9) || (cp >= 0x16FF4 && cp <= 0x16FF6);
}

// Rust's char::is_whitespace: Unicode White_Space, the same 25 code points in every version.
bool is_whitespace(char32_t cp) { return char_class(cp) & kSpace; }

// `tokenizers`' Punctuation: char::is_ascii_punctuation (which counts $+<=>^`|~ too) or the
// unicode_categories crate's is_punctuation, whose tables are Unicode 8.0's: general category P
// for code points Unicode 8.0 had (ICU's age), plus U+166D and U+111C9, which were P in 8.0 and
// are symbols now. Checked against `tokenizers` on every code point.
bool is_punctuation(char32_t cp) {
  if (cp < 0x80) return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
                        (cp >= 0x7B && cp <= 0x7E);
  if (cp == 0x166D || cp == 0x111C9) return true;
  auto c = static_cast<UChar32>(cp);
  if (!(U_GET_GC_MASK(c) & U_GC_P_MASK)) return false;
  UVersionInfo age;
  u_charAge(c, age);
  return age[0] < 8 || (age[0] == 8 && age[1] == 0);
}

// The marks Unicode 16.0 added, which the Rust regex crate's \w (Unicode 16.0) contains and the
// kWord class (ICU 72 plus newer letters and numbers) lacks. Found by pre-tokenizing every code
// point with `tokenizers`' Whitespace (tests/tokenizer/make_family_cases.py checks all of them).
constexpr std::pair<char32_t, char32_t> kNewerWordMarks[] = {
    {0x0897, 0x0897},   {0x10D69, 0x10D6D}, {0x10EFC, 0x10EFC}, {0x113B8, 0x113C0}, {0x113C2, 0x113C2},
    {0x113C5, 0x113C5}, {0x113C7, 0x113CA}, {0x113CC, 0x113D0}, {0x113D2, 0x113D2}, {0x113E1, 0x113E2},
    {0x11F5A, 0x11F5A}, {0x1611E, 0x1612F}, {0x1E5EE, 0x1E5EF},
};

// Unicode \w as the Rust regex crate has it: Alphabetic, marks, Nd, Pc, Join_Control.
bool is_regex_word(char32_t cp) {
  if (char_class(cp) & kWord) return true;
  for (auto [first, last] : kNewerWordMarks) {
    if (cp >= first && cp <= last) return true;
  }
  return false;
}

// `tokenizers`' Whitespace: the matches of \w+|[^\w\s]+ (with the Rust regex crate, not
// Oniguruma) are kept and the rest (whitespace) removed, i.e. maximal runs of word characters
// and maximal runs of other non-space characters.
class WhitespacePreTokenizer : public PreTokenizer {
 public:
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    enum Kind { kSpaceRun, kWordRun, kOtherRun };
    std::vector<Piece> out;
    out.reserve(pieces.size() * 4);
    for (const Piece& piece : pieces) {
      const std::string& text = piece.text;
      size_t pos = 0, run_begin = 0;
      Kind run = kSpaceRun;
      while (pos <= text.size()) {
        size_t begin = pos;
        Kind kind = kSpaceRun;  // the end of the text closes the last run
        if (pos < text.size()) {
          char32_t cp = next_code_point(text, pos);
          kind = is_regex_word(cp) ? kWordRun : is_whitespace(cp) ? kSpaceRun : kOtherRun;
        } else {
          ++pos;
        }
        if (kind == run) continue;
        if (run != kSpaceRun) {
          out.push_back(Piece{text.substr(run_begin, begin - run_begin), piece.first && run_begin == 0});
        }
        run = kind;
        run_begin = begin;
      }
    }
    pieces = std::move(out);
  }
};

// Cuts every piece into the spans a pattern and a behavior keep. A cut piece keeps its "first"
// mark only on the part that starts at its byte 0, as `tokenizers` looks at original offsets.
class PatternPreTokenizer : public PreTokenizer {
 public:
  PatternPreTokenizer(std::optional<Regex> regex, bool (*is_match)(char32_t), SplitBehavior behavior, bool invert)
      : regex_(std::move(regex)), is_match_(is_match), behavior_(behavior), invert_(invert) {}

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    thread_local std::vector<PatternPart> parts;
    thread_local std::vector<Regex::Match> kept;
    std::vector<Piece> out;
    out.reserve(pieces.size() * 4);
    for (Piece& piece : pieces) {
      if (piece.text.empty()) continue;
      parts.clear();
      kept.clear();
      if (regex_) {
        regex_parts(*regex_, piece.text, parts);
      } else {
        char_parts(is_match_, piece.text, parts);
      }
      apply_split_behavior(parts, behavior_, invert_, kept);
      if (kept.size() == 1 && kept[0].first == 0 && kept[0].second == piece.text.size()) {
        out.push_back(std::move(piece));  // uncut: no copy
        continue;
      }
      for (auto [begin, end] : kept) {
        if (begin == end) continue;
        out.push_back(Piece{piece.text.substr(begin, end - begin), piece.first && begin == 0});
      }
    }
    pieces = std::move(out);
  }

 private:
  std::optional<Regex> regex_;  // null: cut by is_match_
  bool (*is_match_)(char32_t);
  SplitBehavior behavior_;
  bool invert_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_split_pre_tokenizer(const JsonSpec& spec) {
  JsonSpec pattern(spec.object("pattern"), spec.where() + ".pattern");
  std::optional<Regex> regex;
  if (pattern.has("Regex")) {
    regex.emplace(pattern.string("Regex"), pattern.where());
  } else if (pattern.has("String")) {
    regex.emplace(Regex::literal(pattern.string("String"), pattern.where()));
  } else {
    DSCHAT_THROW(FormatError, pattern.where(), ": expected a 'Regex' or 'String' key");
  }
  return std::make_unique<PatternPreTokenizer>(std::move(regex), nullptr, parse_split_behavior(spec),
                                               spec.boolean_or("invert", false));
}

std::unique_ptr<PreTokenizer> make_digits_pre_tokenizer(const JsonSpec& spec) {
  SplitBehavior behavior =
      spec.boolean_or("individual_digits", false) ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
  return std::make_unique<PatternPreTokenizer>(std::nullopt, is_numeric, behavior, false);
}

std::unique_ptr<PreTokenizer> make_punctuation_pre_tokenizer(const JsonSpec& spec) {
  SplitBehavior behavior = spec.has("behavior") ? parse_split_behavior(spec) : SplitBehavior::kIsolated;
  return std::make_unique<PatternPreTokenizer>(std::nullopt, is_punctuation, behavior, false);
}

std::unique_ptr<PreTokenizer> make_whitespace_pre_tokenizer() { return std::make_unique<WhitespacePreTokenizer>(); }

std::unique_ptr<PreTokenizer> make_whitespace_split_pre_tokenizer() {
  return std::make_unique<PatternPreTokenizer>(std::nullopt, is_whitespace, SplitBehavior::kRemoved, false);
}

}  // namespace tokenizer
}  // namespace dschat
