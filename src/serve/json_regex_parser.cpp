#include "serve/json_regex_parser.h"

#include <algorithm>
#include <cctype>

#include "serve/openai_protocol.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace serve {
namespace detail {
namespace {

constexpr int kMaxRepeat = 1000;  // {n,m} bounds read (the expansion is bounded by JsonRegex::kMaxPositions)

CodeRanges normalized_ranges(CodeRanges ranges) {
  std::sort(ranges.begin(), ranges.end());
  CodeRanges out;
  for (const auto& range : ranges) {
    if (!out.empty() && range.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, range.second);
    } else {
      out.push_back(range);
    }
  }
  return out;
}

}  // namespace

CodeRanges complement_ranges(const CodeRanges& ranges, uint32_t last) {
  CodeRanges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalized_ranges(ranges)) {
    if (lo > last) break;
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= last) out.emplace_back(next, last);
  return out;
}

namespace {

// ECMA-262's pattern grammar, the supported part (json_regex.h).
class PatternParser {
 public:
  PatternParser(const std::string& pattern, const std::string& where) : text_(pattern), where_(where) {}

  // The whole pattern; `anchored_start` / `anchored_end` report a leading ^ / trailing $.
  PatternAst run(bool& anchored_start, bool& anchored_end) {
    if (tokenizer::find_invalid_utf8(text_) != std::string_view::npos) fail("is not valid UTF-8");
    anchored_start = !text_.empty() && text_[0] == '^';
    anchored_end = ends_with_anchor();
    at_ = anchored_start ? 1 : 0;
    end_ = text_.size() - (anchored_end ? 1 : 0);
    PatternAst ast = alternatives(/*top=*/true);
    if (at_ != end_) fail("has an unmatched ')'");
    if (top_alternatives_ && (anchored_start || anchored_end)) {
      fail("anchors a top-level '|' (^a|b$ anchors only a and b): write ^(a|b)$");
    }
    return ast;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw ApiError(400, "'" + where_ + "' " + why + " (pattern " + text_ + ")", where_);
  }

  bool ends_with_anchor() const {
    if (text_.empty() || text_.back() != '$' || text_.size() == (text_[0] == '^' ? 1u : 0u)) return false;
    size_t slashes = 0;  // an escaped \$ is a literal
    for (size_t i = text_.size() - 1; i-- > 0 && text_[i] == '\\';) ++slashes;
    return slashes % 2 == 0;
  }

  bool more() const { return at_ < end_; }
  char peek() const { return text_[at_]; }

  PatternAst alternatives(bool top) {
    PatternAst node;
    node.kind = PatternAst::Kind::kAlternatives;
    node.kids.push_back(sequence());
    while (more() && peek() == '|') {
      ++at_;
      if (top) top_alternatives_ = true;
      node.kids.push_back(sequence());
    }
    return node.kids.size() == 1 ? std::move(node.kids[0]) : node;
  }

  PatternAst sequence() {
    PatternAst node;
    while (more() && peek() != '|' && peek() != ')') {
      PatternAst item = atom();
      quantified(item);
      node.kids.push_back(std::move(item));
    }
    return node;
  }

  void quantified(PatternAst& item) {
    if (!more()) return;
    int min = 0, max = -1;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++at_;
      min = c == '+' ? 1 : 0;
      max = c == '?' ? 1 : -1;
    } else if (c == '{') {
      ++at_;
      min = number();
      max = min;
      if (more() && peek() == ',') {
        ++at_;
        max = more() && peek() == '}' ? -1 : number();
      }
      if (!more() || peek() != '}') fail("has a '{' that opens no {n}, {n,} or {n,m} quantifier");
      ++at_;
      if (max >= 0 && max < min) fail("has a quantifier {n,m} with m below n");
    } else {
      return;
    }
    if (more() && peek() == '?') ++at_;  // lazy: the same strings match
    if (more() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')) fail("repeats a quantifier");
    PatternAst repeat;
    repeat.kind = PatternAst::Kind::kRepeat;
    repeat.min = min;
    repeat.max = max;
    repeat.kids.push_back(std::move(item));
    item = std::move(repeat);
  }

  int number() {
    int value = 0, digits = 0;
    while (more() && peek() >= '0' && peek() <= '9') {
      value = std::min(value * 10 + (peek() - '0'), kMaxRepeat + 1);
      ++at_;
      ++digits;
    }
    if (digits == 0) fail("has a '{' that opens no {n}, {n,} or {n,m} quantifier");
    if (value > kMaxRepeat) fail("repeats more than " + std::to_string(kMaxRepeat) + " times");
    return value;
  }

  PatternAst atom() {
    const char c = peek();
    PatternAst node;
    node.kind = PatternAst::Kind::kClass;
    if (c == '(') {
      ++at_;
      if (more() && peek() == '?') {
        if (at_ + 1 < end_ && text_[at_ + 1] == ':') {
          at_ += 2;
        } else {
          fail("has a lookaround or named group '(?', which is not supported");
        }
      }
      PatternAst inner = alternatives(/*top=*/false);
      if (!more() || peek() != ')') fail("has an unclosed '('");
      ++at_;
      return inner;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("has a quantifier with nothing to repeat");
    if (c == '^' || c == '$') fail("has a '" + std::string(1, c) + "' anchor inside; only a leading ^ and trailing $");
    if (c == '[') {
      node.ranges = bracket();
    } else if (c == '.') {  // any character but ECMA-262's line terminators
      ++at_;
      node.ranges = complement_ranges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}, kLastCodePoint);
    } else if (c == '\\') {
      ++at_;
      bool shorthand = false;
      node.ranges = escape(/*in_class=*/false, shorthand);
    } else {
      const uint32_t literal = code_point();
      node.ranges = {{literal, literal}};
    }
    return node;
  }

  // One character of the pattern (run() checked it is UTF-8).
  uint32_t code_point() { return tokenizer::next_code_point(text_, at_); }

  uint32_t hex(int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      if (!more() || !std::isxdigit(static_cast<unsigned char>(peek()))) {
        fail("has a \\x or \\u escape without hex digits");
      }
      const char h = peek();
      value = value * 16 + static_cast<uint32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      ++at_;
    }
    return value;
  }

  // After a backslash. `shorthand` is set for \d \w \s and their negations.
  CodeRanges escape(bool in_class, bool& shorthand) {
    if (!more()) fail("ends with a lone backslash");
    static const CodeRanges kDigit = {{'0', '9'}};
    static const CodeRanges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const CodeRanges kSpace = {{'\t', '\r'}, {' ', ' '}};
    const char c = text_[at_++];
    switch (c) {
      case 'd': case 'w': case 's': case 'D': case 'W': case 'S': {
        shorthand = true;
        const char lower = static_cast<char>(c | 0x20);
        const CodeRanges& set = lower == 'd' ? kDigit : lower == 'w' ? kWord : kSpace;
        return c == lower ? set : complement_ranges(set, 0x7F);  // negations: ASCII only (json_regex.h)
      }
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 't': return {{'\t', '\t'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0': return {{0, 0}};
      case 'x': { const uint32_t v = hex(2); return {{v, v}}; }
      case 'u': {
        const uint32_t v = hex(4);
        if (v >= 0xD800 && v <= 0xDFFF) fail("has a surrogate \\u escape");
        return {{v, v}};
      }
      case 'b':
        if (in_class) return {{'\b', '\b'}};
        fail("has a word boundary \\b, which is not supported");
      default:
        break;
    }
    if (std::isalnum(static_cast<unsigned char>(c))) {
      fail(std::string("has the escape \\") + c + ", which is not supported (backreference, property or unknown)");
    }
    --at_;
    const uint32_t literal = code_point();  // an escaped punctuation character is itself
    return {{literal, literal}};
  }

  // After '[': a class, its ranges and escapes, perhaps negated.
  CodeRanges bracket() {
    ++at_;
    const bool negated = more() && peek() == '^';
    if (negated) ++at_;
    CodeRanges ranges;
    bool shorthand_inside = false;
    bool first = true;
    while (more() && (peek() != ']' || first)) {
      first = false;
      bool shorthand = false;
      CodeRanges item = member(shorthand);
      shorthand_inside = shorthand_inside || shorthand;
      if (!shorthand && more() && peek() == '-' && at_ + 1 < end_ && text_[at_ + 1] != ']') {
        ++at_;
        bool shorthand_after = false;
        const CodeRanges to = member(shorthand_after);
        if (shorthand_after) fail("has a class range that ends in \\d, \\w or \\s");
        if (to[0].first < item[0].first) fail("has a class range out of order");
        item = {{item[0].first, to[0].first}};
      }
      ranges.insert(ranges.end(), item.begin(), item.end());
    }
    if (!more()) fail("has an unclosed '['");
    ++at_;
    if (!negated) return normalized_ranges(ranges);
    // ECMA-262 and Python disagree on which non-ASCII characters \d \w \s hold: keep to ASCII.
    return complement_ranges(ranges, shorthand_inside ? 0x7F : kLastCodePoint);
  }

  CodeRanges member(bool& shorthand) {
    if (peek() == '\\') {
      ++at_;
      return escape(/*in_class=*/true, shorthand);
    }
    if (peek() == '[' && at_ + 1 < end_ && (text_[at_ + 1] == ':' || text_[at_ + 1] == '=' || text_[at_ + 1] == '.')) {
      fail("has a POSIX class '[:' inside a class, which is not supported");
    }
    const uint32_t c = code_point();
    return {{c, c}};
  }

  const std::string& text_;
  const std::string& where_;
  size_t at_ = 0, end_ = 0;
  bool top_alternatives_ = false;
};

}  // namespace

ParsedPattern parse_pattern(const std::string& pattern, const std::string& where) {
  ParsedPattern parsed;
  parsed.ast = PatternParser(pattern, where).run(parsed.anchored_start, parsed.anchored_end);
  return parsed;
}

}  // namespace detail
}  // namespace serve
}  // namespace dschat
