#include "tokenizer/split.h"

#include <algorithm>

#include "dschat/core/error.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {

SplitBehavior parse_split_behavior(const JsonSpec& spec) {
  std::string behavior = spec.string("behavior");
  if (behavior == "Removed") return SplitBehavior::kRemoved;
  if (behavior == "Isolated") return SplitBehavior::kIsolated;
  if (behavior == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (behavior == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (behavior == "Contiguous") return SplitBehavior::kContiguous;
  DSCHAT_THROW(FormatError, spec.where(), ": key 'behavior' must be Removed, Isolated, MergedWithPrevious, ",
               "MergedWithNext or Contiguous, got '", behavior, "'");
}

void regex_parts(const Regex& regex, std::string_view text, std::vector<PatternPart>& out) {
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  thread_local std::vector<Regex::Match> matches;
  matches.clear();
  regex.find_all(text, matches);
  size_t previous = 0;
  for (auto [begin, end] : matches) {
    if (previous != begin) out.push_back({previous, begin, false});
    out.push_back({begin, end, true});
    previous = end;
  }
  if (previous != text.size()) out.push_back({previous, text.size(), false});
}

void char_parts(bool (*is_match)(char32_t), std::string_view text, std::vector<PatternPart>& out) {
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  size_t gap_begin = 0, pos = 0;
  while (pos < text.size()) {
    size_t begin = pos;
    char32_t cp = next_code_point(text, pos);
    if (!is_match(cp)) continue;
    if (gap_begin < begin) out.push_back({gap_begin, begin, false});
    out.push_back({begin, pos, true});
    gap_begin = pos;
  }
  if (gap_begin < text.size()) out.push_back({gap_begin, text.size(), false});
}

void apply_split_behavior(std::vector<PatternPart>& parts, SplitBehavior behavior, bool invert,
                          std::vector<Regex::Match>& kept) {
  if (invert) {
    for (PatternPart& part : parts) part.is_match = !part.is_match;
  }
  // The folds below are those of NormalizedString::split, including their quirks: Contiguous
  // also joins neighbouring gaps, and the merges look only at the previous part's kind.
  std::vector<Regex::Match> spans;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const PatternPart& part : parts) {
        if (!part.is_match) kept.emplace_back(part.begin, part.end);
      }
      return;
    case SplitBehavior::kIsolated:
      for (const PatternPart& part : parts) kept.emplace_back(part.begin, part.end);
      return;
    case SplitBehavior::kContiguous:
      for (const PatternPart& part : parts) {
        if (part.is_match == previous_match && !spans.empty()) {
          spans.back().second = part.end;
        } else {
          spans.emplace_back(part.begin, part.end);
        }
        previous_match = part.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const PatternPart& part : parts) {
        if (part.is_match && !previous_match && !spans.empty()) {
          spans.back().second = part.end;
        } else {
          spans.emplace_back(part.begin, part.end);
        }
        previous_match = part.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto part = parts.rbegin(); part != parts.rend(); ++part) {
        if (part->is_match && !previous_match && !spans.empty()) {
          spans.back().first = part->begin;
        } else {
          spans.emplace_back(part->begin, part->end);
        }
        previous_match = part->is_match;
      }
      std::reverse(spans.begin(), spans.end());
      break;
  }
  kept.insert(kept.end(), spans.begin(), spans.end());
}

}  // namespace tokenizer
}  // namespace dschat
