#pragma once
// The Lowercase normalizer of `tokenizers`: each code point is replaced by its full lowercase
// mapping on its own (Rust's char::to_lowercase), with no context, so a final capital sigma
// becomes U+03C3 (not U+03C2) and U+0130 becomes "i" + U+0307, whatever the locale.

#include <string>

namespace dschat {
namespace tokenizer {

/// Lowercases valid UTF-8 `text` in place.
void lowercase_utf8(std::string& text);

}  // namespace tokenizer
}  // namespace dschat
