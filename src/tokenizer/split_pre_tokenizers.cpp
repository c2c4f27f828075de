#include "tokenizer/split_pre_tokenizers.h"

#include <optional>
#include <string>
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

std::unique_ptr<PreTokenizer> make_whitespace_split_pre_tokenizer() {
  return std::make_unique<PatternPreTokenizer>(std::nullopt, is_whitespace, SplitBehavior::kRemoved, false);
}

}  // namespace tokenizer
}  // namespace dschat
