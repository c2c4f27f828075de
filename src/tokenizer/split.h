#pragma once
// How `tokenizers` cuts a string with a pattern (NormalizedString::split): the pattern first
// divides the text into matches and the gaps between them, then a SplitDelimiterBehavior decides
// what becomes of the matches. Shared by the Split, Digits and WhitespaceSplit pre-tokenizers.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/json_spec.h"
#include "tokenizer/regex.h"

namespace dschat {
namespace tokenizer {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

/// The "behavior" key of a Split component.
SplitBehavior parse_split_behavior(const JsonSpec& spec);

struct PatternPart {
  size_t begin, end;  // byte offsets
  bool is_match;
};

/// `text` as matches of `regex` and the gaps between them, in order, covering all of `text`
/// (an empty text is one empty gap), as `tokenizers`' Pattern::find_matches for a regex.
void regex_parts(const Regex& regex, std::string_view text, std::vector<PatternPart>& out);

/// `text` cut by a character predicate: every code point for which `is_match` holds is a match of
/// its own (Pattern::find_matches for a `Fn(char) -> bool`).
void char_parts(bool (*is_match)(char32_t), std::string_view text, std::vector<PatternPart>& out);

/// The [begin, end) ranges `behavior` keeps of `parts` (matches flipped first when `invert`);
/// some may be empty, and callers drop those as `tokenizers` does.
void apply_split_behavior(std::vector<PatternPart>& parts, SplitBehavior behavior, bool invert,
                          std::vector<Regex::Match>& kept);

}  // namespace tokenizer
}  // namespace dschat
