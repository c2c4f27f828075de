#pragma once
// GPT-2's pre-tokenisation regex, hand-written over code points:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// It equals the Oniguruma matcher that Hugging Face `tokenizers` runs for its ByteLevel
// pre-tokenizer (leftmost-first alternation, greedy runs, the lookahead backing off one code
// point), and is about an order of magnitude faster than a general regex engine.

#include <cstddef>
#include <string_view>
#include <utility>
#include <vector>

namespace dschat {
namespace tokenizer {

using Span = std::pair<size_t, size_t>;  // [begin, end) byte offsets

/// Appends the pre-tokens of valid UTF-8 `text` to `out`; together they cover `text` exactly.
void split_gpt2(std::string_view text, std::vector<Span>& out);

}  // namespace tokenizer
}  // namespace dschat
