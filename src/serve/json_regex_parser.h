#pragma once
// Private to json_regex.cpp (and its tests): a JSON Schema pattern parsed as ECMA-262, the
// supported part (json_regex.h), into a tree of character classes, sequences, alternatives and
// repeats. Classes are sorted, disjoint code point ranges.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dschat {
namespace serve {
namespace detail {

using CodeRanges = std::vector<std::pair<uint32_t, uint32_t>>;  // sorted, disjoint, inclusive

constexpr uint32_t kLastCodePoint = 0x10FFFF;

struct PatternAst {
  enum class Kind : uint8_t { kClass, kSequence, kAlternatives, kRepeat };
  Kind kind = Kind::kSequence;
  CodeRanges ranges;              // kClass
  std::vector<PatternAst> kids;   // kSequence, kAlternatives; kRepeat: one
  int min = 0, max = 0;           // kRepeat (max -1: no bound)
};

struct ParsedPattern {
  PatternAst ast;
  bool anchored_start = false;  // a leading ^
  bool anchored_end = false;    // a trailing $
};

/// Throws ApiError(400) naming `where` for a malformed or unsupported pattern.
ParsedPattern parse_pattern(const std::string& pattern, const std::string& where);

/// Every code point in [0, last] that `ranges` do not hold.
CodeRanges complement_ranges(const CodeRanges& ranges, uint32_t last);

}  // namespace detail
}  // namespace serve
}  // namespace dschat
