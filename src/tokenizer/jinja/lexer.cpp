#include "tokenizer/jinja/lexer.h"

#include <cctype>
#include <cstdlib>

#include "dschat/core/error.h"

namespace dschat {
namespace tokenizer {
namespace jinja {
namespace lexer_detail {

bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

bool all_space(const std::string& text, size_t from) {
  if (from >= text.size()) return false;  // jinja2's \s+ needs one character
  for (uint32_t p : code_points(text.substr(from))) {
    if (!is_space(p)) return false;
  }
  return true;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& origin) : origin_(origin) {
    // newline_sequence "\n" and keep_trailing_newline=False.
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t at = src_.find('{', pos);
      while (at != std::string::npos && at + 1 < src_.size() && src_[at + 1] != '{' && src_[at + 1] != '%' &&
             src_[at + 1] != '#') {
        at = src_.find('{', at + 1);
      }
      if (at == std::string::npos || at + 1 >= src_.size()) {
        text(src_.substr(pos), pos);
        break;
      }
      const char kind = src_[at + 1];
      const char sign = at + 2 < src_.size() && (src_[at + 2] == '-' || src_[at + 2] == '+') ? src_[at + 2] : 0;
      std::string data = src_.substr(pos, at - pos);
      if (sign == '-') {
        data = strip(data, false, true);
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        const size_t line_start = data.rfind('\n') + 1;  // npos + 1 == 0
        if ((line_start > 0 || line_starting) && all_space(data, line_start)) data.resize(line_start);
      }
      text(data, pos);
      size_t inside = at + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        pos = comment_end(at, inside);
      } else {
        pos = tag(at, inside, kind == '%');
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back(Token{Tok::kEof, "", pos_of(src_.size())});
    return tokens_;
  }

 private:
  Pos pos_of(size_t offset) const {
    size_t line = 0;
    while (line + 1 < line_starts_.size() && line_starts_[line + 1] <= offset) ++line;
    return Pos{static_cast<int>(line + 1), static_cast<int>(offset - line_starts_[line] + 1)};
  }

  [[noreturn]] void fail(size_t offset, const std::string& message) const {
    DSCHAT_THROW(FormatError, where(origin_, pos_of(offset)), ": template syntax error: ", message);
  }

  void text(const std::string& data, size_t offset) {
    if (!data.empty()) tokens_.push_back(Token{Tok::kText, data, pos_of(offset)});
  }

  // After "-X}": all whitespace; after "X}": one newline (trim_blocks) unless `trim` is false.
  size_t after_end(size_t end, bool minus, bool trim) const {
    if (minus) {
      while (end < src_.size()) {
        const std::vector<uint32_t> next = code_points(src_.substr(end, 4));
        if (next.empty() || !is_space(next[0])) break;
        end += utf8({next[0]}).size();
      }
    } else if (trim && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    return end;
  }

  size_t comment_end(size_t open, size_t from) const {
    const size_t close = src_.find("#}", from);
    if (close == std::string::npos) fail(open, "the comment is never closed with #}");
    const char before = close > from ? src_[close - 1] : 0;
    return after_end(close + 2, before == '-', before != '+');
  }

  size_t tag(size_t open, size_t p, bool block) {
    tokens_.push_back(Token{block ? Tok::kBlockBegin : Tok::kVarBegin, block ? "{%" : "{{", pos_of(open)});
    std::string balance;
    bool first = true;
    while (true) {
      while (p < src_.size() && ascii_space(src_[p])) ++p;
      if (p >= src_.size()) fail(open, std::string("the tag is never closed with ") + (block ? "%}" : "}}"));
      const std::string end = block ? "%}" : "}}";
      if (balance.empty()) {
        if (src_.compare(p, 3, "-" + end) == 0) {
          tokens_.push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, end, pos_of(p)});
          return after_end(p + 3, true, false);
        }
        if (block && src_.compare(p, 3, "+%}") == 0) {
          tokens_.push_back(Token{Tok::kBlockEnd, end, pos_of(p)});
          return p + 3;
        }
        if (src_.compare(p, 2, end) == 0) {
          tokens_.push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, end, pos_of(p)});
          return after_end(p + 2, false, block);
        }
      }
      const char c = src_[p];
      const Pos pos = pos_of(p);
      if (std::isdigit(static_cast<unsigned char>(c))) {
        p = number(p);
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t q = p;
        while (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
        tokens_.push_back(Token{Tok::kName, src_.substr(p, q - p), pos});
        if (block && first && tokens_.back().text == "raw") {
          DSCHAT_THROW(Unsupported, where(origin_, pos), ": '{% raw %}' blocks are not supported by dschat's Jinja subset");
        }
        p = q;
      } else if (c == '\'' || c == '"') {
        p = string(p);
      } else {
        static const char* const kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                                 "]", "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
        std::string op;
        for (const char* candidate : kOperators) {
          if (src_.compare(p, std::char_traits<char>::length(candidate), candidate) == 0) {
            op = candidate;
            break;
          }
        }
        if (op.empty()) fail(p, std::string("unexpected character '") + c + "'");
        if (op == "(" || op == "[" || op == "{") {
          balance += op;
        } else if (op == ")" || op == "]" || op == "}") {
          static const std::string kOpen = "([{", kClose = ")]}";
          if (balance.empty() || kOpen.find(balance.back()) != kClose.find(op[0])) fail(p, "unexpected '" + op + "'");
          balance.pop_back();
        }
        tokens_.push_back(Token{Tok::kOperator, op, pos});
        p += op.size();
      }
      first = false;
    }
  }

  size_t number(size_t p) {
    size_t q = p;
    while (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
    bool is_float = false;
    const bool after_dot = p > 0 && src_[p - 1] == '.';  // "x.0.1": an index, then another
    if (!after_dot && q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
      is_float = true;
      ++q;
      while (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
    }
    if (!after_dot && q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
        is_float = true;
        q = r;
        while (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
      }
    }
    Token token{is_float ? Tok::kFloat : Tok::kInteger, src_.substr(p, q - p), pos_of(p)};
    if (is_float) {
      token.number = std::strtod(token.text.c_str(), nullptr);
    } else {
      token.integer = std::strtoll(token.text.c_str(), nullptr, 10);
    }
    tokens_.push_back(token);
    return q;
  }

  // A quoted literal, decoded as Python's "unicode-escape" codec decodes it.
  size_t string(size_t p) {
    const char quote = src_[p];
    std::string value;
    size_t q = p + 1;
    while (true) {
      if (q >= src_.size()) fail(p, "the string is never closed");
      const char c = src_[q];
      if (c == quote) break;
      if (c != '\\' || q + 1 >= src_.size()) {
        value += c;
        ++q;
        continue;
      }
      const char e = src_[q + 1];
      q += 2;
      const auto hex = [&](size_t digits) {
        if (q + digits > src_.size()) fail(q, "truncated \\x, \\u or \\U escape");
        const std::string code = src_.substr(q, digits);
        for (char h : code) {
          if (!std::isxdigit(static_cast<unsigned char>(h))) fail(q, "bad escape digits '" + code + "'");
        }
        q += digits;
        value += utf8({static_cast<uint32_t>(std::strtoul(code.c_str(), nullptr, 16))});
      };
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '\n': break;  // a line continuation
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        case 'N': DSCHAT_THROW(Unsupported, where(origin_, pos_of(q - 2)), ": \\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t code = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && q < src_.size() && src_[q] >= '0' && src_[q] <= '7'; ++k) code = code * 8 + (src_[q++] - '0');
            value += utf8({code});
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    tokens_.push_back(Token{Tok::kString, value, pos_of(p)});
    return q + 1;
  }

  const std::string& origin_;
  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace lexer_detail

std::vector<Token> lex(const std::string& source, const std::string& origin) {
  return lexer_detail::Lexer(source, origin).run();
}

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
