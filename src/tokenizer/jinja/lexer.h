#pragma once
// Template source -> tokens, as jinja2's lexer splits it with transformers' settings
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
//   - newlines are normalised to "\n" and one trailing newline is dropped;
//   - "{%-", "{{-", "{#-" strip all whitespace before the tag, "-%}", "-}}", "-#}" all after it;
//   - lstrip_blocks: spaces and tabs from the start of a line up to "{%" or "{#" are dropped
//     (not before "{{", nor with "{%+");
//   - trim_blocks: the first newline after "%}" or "#}" is dropped (not after "+%}").
// Comments disappear. "{% raw %}" is refused (core::Unsupported). Private to src/tokenizer/jinja.

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace dschat {
namespace tokenizer {
namespace jinja {

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInteger, kFloat, kOperator, kEof };

struct Token {
  Tok type = Tok::kEof;
  std::string text;  // kText: the data; kName, kOperator: the name or operator; kString: the decoded value
  Pos pos;
  int64_t integer = 0;
  double number = 0.0;
};

/// Throws core::FormatError (syntax: an unclosed tag or string, a stray character) or
/// core::Unsupported, both naming origin:line:column.
std::vector<Token> lex(const std::string& source, const std::string& origin);

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
