#pragma once
// Runs a parsed template. Scoping follows jinja2: a for loop's body is a fresh scope on every
// iteration (what it sets is gone after the iteration; a namespace() carries values out), `if`
// opens none, lookups fall through to the enclosing scopes, then to the global functions.
// Errors are core::InvalidArgument (or core::Unsupported) naming origin:line:column.
// Private to src/tokenizer/jinja.

#include <string>

#include "tokenizer/jinja/ast.h"

namespace dschat {
namespace tokenizer {
namespace jinja {

std::string render(const Body& body, const Dict& variables, const std::string& origin);

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
