#pragma once
// A JSON Schema `pattern` (or a `format` written as one) compiled for schema-guided decoding: a
// position automaton (Glushkov's: one state per character class of the expanded pattern, no
// empty moves) that the byte machine (json_machine.h) steps once per code point of the string
// being written, so a string the machine closes is matched by the pattern.
//
// The pattern is read as ECMA-262 (JSON Schema's dialect) and matched as validators do, searched
// anywhere in the string unless anchored by a leading ^ / trailing $. Supported: literals, `.`,
// classes with ranges and negation, \d \w \s and their negations, escapes (\n \t \xHH \uHHHH and
// escaped punctuation), groups (plain or (?:...)), |, and the quantifiers * + ? {n} {n,} {n,m}
// (lazy forms too). Refused by name: backreferences, lookaround, \b, ^ or $ anywhere else, and
// patterns of more than kMaxPositions classes once repeats are expanded.
//
// Where ECMA-262 and Python's `re` (what the `jsonschema` package matches with) differ, only what
// both accept is generated: \d \w \s are their ASCII sets, their negations (and a negated class
// holding them) ASCII characters only, `.` no line terminator.

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dschat {
namespace serve {

class JsonRegex {
 public:
  static constexpr int kMaxStates = 128;
  static constexpr int kMaxPositions = kMaxStates - 1;  // state 0 is the start
  static constexpr int64_t kMaxLengthHorizon = 4096;
  using States = std::array<uint64_t, kMaxStates / 64>;  // a set of states, bit s = state s

  /// `length_horizon`: the largest minLength / maxLength the string also has (0: none), up to
  /// kMaxLengthHorizon. Throws ApiError(400) naming `where` when the pattern is malformed,
  /// unsupported, too large or matches no string.
  JsonRegex(const std::string& pattern, const std::string& where, int64_t length_horizon = 0);

  static States start() { return States{1, 0}; }
  /// The states after reading code point `c` from `states` (empty: `c` cannot come here). Every
  /// state kept can still reach a match.
  States step(const States& states, uint32_t c) const;
  bool matches(const States& states) const { return intersects(states, accepting_); }
  /// Whether some code point in [lo, hi] can come next from `states` with a match L more code
  /// points on (counting it) for some L in [at_least, at_most] (at_most -1: no bound).
  bool can_step_within(const States& states, uint32_t lo, uint32_t hi, int64_t at_least, int64_t at_most) const;
  /// Whether `states` reach a match in L more code points for some L in [at_least, at_most]
  /// (at_most -1: no bound; a bound must be within the horizon given at construction).
  bool can_match_within(const States& states, int64_t at_least, int64_t at_most) const;

  static bool intersects(const States& a, const States& b) { return (a[0] & b[0]) != 0 || (a[1] & b[1]) != 0; }
  static bool empty(const States& a) { return a[0] == 0 && a[1] == 0; }

 private:
  using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // sorted, disjoint, inclusive

  int states_ = 1;
  std::vector<Ranges> classes_;     // [states]: what each position's class holds (state 0: nothing)
  std::vector<States> follow_;      // [states]: the positions that may come after each state
  std::array<States, 128> ascii_{};  // [ASCII code]: the positions whose class holds it
  States accepting_{};
  // can_match_within: exactly_[L] are the states with a match exactly L code points on
  // (L < states + horizon); unbounded_ those with matches arbitrarily far on (a loop on the way).
  std::vector<States> exactly_;
  States unbounded_{};

  friend class RegexBuilder;
};

}  // namespace serve
}  // namespace dschat
