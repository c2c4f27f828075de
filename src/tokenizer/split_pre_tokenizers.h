#pragma once
// Pre-tokenizers that cut pieces with a pattern: Split (a regex or a literal string, any
// SplitDelimiterBehavior, optionally inverted), Digits, Punctuation, Whitespace and WhitespaceSplit.

#include <memory>

#include "tokenizer/json_spec.h"
#include "tokenizer/pre_tokenizer.h"

namespace dschat {
namespace tokenizer {

/// {"type": "Split", "pattern": {"Regex": ...} or {"String": ...}, "behavior": ..., "invert": ...}
std::unique_ptr<PreTokenizer> make_split_pre_tokenizer(const JsonSpec& spec);

/// {"type": "Digits", "individual_digits": ...}: numbers (\p{N}) isolated one by one, or in runs.
std::unique_ptr<PreTokenizer> make_digits_pre_tokenizer(const JsonSpec& spec);

/// {"type": "Punctuation", "behavior": ...}: ASCII punctuation and Unicode 8.0's category P.
std::unique_ptr<PreTokenizer> make_punctuation_pre_tokenizer(const JsonSpec& spec);

/// {"type": "Whitespace"}: runs of word characters (\w) and runs of other non-space characters.
std::unique_ptr<PreTokenizer> make_whitespace_pre_tokenizer();

/// {"type": "WhitespaceSplit"}: the runs between White_Space characters.
std::unique_ptr<PreTokenizer> make_whitespace_split_pre_tokenizer();

}  // namespace tokenizer
}  // namespace dschat
