#pragma once
// Tokens -> the statement tree, with jinja2's grammar and operator precedence (lowest first):
//   x if c else y | or | and | not | == != < <= > >= in, not in (chained) | + - | ~ | * / // %
//   | ** | unary - + | primary with .attr [index] [a:b:c] (call) | filter, is test.
// Everything outside dschat's subset is refused here, before anything renders: macros, call,
// filter and include/import/extends blocks, unknown filters, tests, functions and methods
// (core::Unsupported naming origin:line:column and the construct). Private to src/tokenizer/jinja.

#include <string>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace dschat {
namespace tokenizer {
namespace jinja {

/// Throws core::FormatError (syntax) or core::Unsupported, naming origin:line:column.
Body parse(const std::vector<Token>& tokens, const std::string& origin);

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
