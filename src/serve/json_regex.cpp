#include "serve/json_regex.h"

#include <algorithm>

#include "serve/json_regex_parser.h"
#include "serve/openai_protocol.h"

namespace dschat {
namespace serve {
namespace {

using Ranges = detail::CodeRanges;
using States = JsonRegex::States;
using detail::PatternAst;

bool class_holds(const Ranges& ranges, uint32_t c) {
  const auto it = std::upper_bound(ranges.begin(), ranges.end(), std::make_pair(c, detail::kLastCodePoint));
  return it != ranges.begin() && std::prev(it)->second >= c;
}

void add_state(States& set, int state) { set[static_cast<size_t>(state) / 64] |= uint64_t{1} << (state % 64); }
States union_of(const States& a, const States& b) { return States{a[0] | b[0], a[1] | b[1]}; }

template <typename F>
void for_each_state(const States& set, F&& visit) {
  for (size_t word = 0; word < set.size(); ++word) {
    for (uint64_t bits = set[word]; bits != 0; bits &= bits - 1) {
      visit(static_cast<int>(word * 64) + __builtin_ctzll(bits));
    }
  }
}

}  // namespace

// Glushkov's construction: each class of the expanded pattern is a state; a fragment's first and
// last states and whether it matches the empty string give how fragments join.
class RegexBuilder {
 public:
  RegexBuilder(JsonRegex& regex, const std::string& where, const std::string& pattern)
      : regex_(regex), where_(where), pattern_(pattern) {
    regex_.classes_.assign(1, Ranges{});
    regex_.follow_.assign(1, States{});
  }

  struct Fragment {
    bool nullable = true;
    States first{}, last{};
  };

  Fragment emit(const PatternAst& node) {
    switch (node.kind) {
      case PatternAst::Kind::kClass: return position(node.ranges);
      case PatternAst::Kind::kSequence: {
        Fragment all;
        for (const PatternAst& kid : node.kids) all = join(all, emit(kid));
        return all;
      }
      case PatternAst::Kind::kAlternatives: {
        Fragment any{false, {}, {}};
        for (const PatternAst& kid : node.kids) {
          const Fragment one = emit(kid);
          any.nullable = any.nullable || one.nullable;
          any.first = union_of(any.first, one.first);
          any.last = union_of(any.last, one.last);
        }
        return any;
      }
      case PatternAst::Kind::kRepeat: {
        Fragment all;
        for (int i = 0; i < node.min; ++i) all = join(all, emit(node.kids[0]));
        if (node.max < 0) return join(all, star(emit(node.kids[0])));
        for (int i = node.min; i < node.max; ++i) {
          Fragment optional = emit(node.kids[0]);
          optional.nullable = true;
          all = join(all, optional);
        }
        return all;
      }
    }
    return Fragment{};
  }

  Fragment position(const Ranges& ranges) {
    if (regex_.states_ == JsonRegex::kMaxStates) {
      throw ApiError(400, "'" + where_ + "' has more than " + std::to_string(JsonRegex::kMaxPositions) +
                              " characters or classes once its repeats are expanded (pattern " + pattern_ + ")",
                     where_);
    }
    const int state = regex_.states_++;
    regex_.classes_.push_back(ranges);
    regex_.follow_.push_back(States{});
    Fragment one{false, {}, {}};
    add_state(one.first, state);
    add_state(one.last, state);
    return one;
  }

  Fragment join(const Fragment& a, const Fragment& b) {
    for_each_state(a.last, [&](int s) { regex_.follow_[s] = union_of(regex_.follow_[s], b.first); });
    Fragment both;
    both.nullable = a.nullable && b.nullable;
    both.first = a.nullable ? union_of(a.first, b.first) : a.first;
    both.last = b.nullable ? union_of(a.last, b.last) : b.last;
    return both;
  }

  Fragment star(Fragment f) {
    for_each_state(f.last, [&](int s) { regex_.follow_[s] = union_of(regex_.follow_[s], f.first); });
    f.nullable = true;
    return f;
  }

 private:
  JsonRegex& regex_;
  const std::string& where_;
  const std::string& pattern_;
};

JsonRegex::JsonRegex(const std::string& pattern, const std::string& where, int64_t length_horizon) {
  const detail::ParsedPattern parsed = detail::parse_pattern(pattern, where);
  RegexBuilder builder(*this, where, pattern);
  // Unanchored ends match anything: a search, as validators run the pattern.
  const auto anything = [&] { return builder.star(builder.position({{0, detail::kLastCodePoint}})); };
  RegexBuilder::Fragment whole;
  if (!parsed.anchored_start) whole = anything();
  whole = builder.join(whole, builder.emit(parsed.ast));
  if (!parsed.anchored_end) whole = builder.join(whole, anything());
  follow_[0] = whole.first;
  accepting_ = whole.last;
  if (whole.nullable) add_state(accepting_, 0);

  // Keep only states that can be entered (a non-empty class) and can still reach a match.
  States enterable{};
  add_state(enterable, 0);
  for (int s = 1; s < states_; ++s) {
    if (!classes_[s].empty()) add_state(enterable, s);
  }
  States live{accepting_[0] & enterable[0], accepting_[1] & enterable[1]};
  for (bool grew = true; grew;) {
    grew = false;
    for (int s = 0; s < states_; ++s) {
      const bool in = (live[s / 64] >> (s % 64)) & 1;
      const States next{follow_[s][0] & live[0], follow_[s][1] & live[1]};
      if (!in && (enterable[s / 64] >> (s % 64) & 1) && !empty(next)) {
        add_state(live, s);
        grew = true;
      }
    }
  }
  if (!(live[0] & 1)) throw ApiError(400, "'" + where + "' matches no string (pattern " + pattern + ")", where);
  for (States& next : follow_) next = States{next[0] & live[0], next[1] & live[1]};
  accepting_ = States{accepting_[0] & live[0], accepting_[1] & live[1]};
  for (int c = 0; c < 128; ++c) {
    for (int s = 1; s < states_; ++s) {
      if (class_holds(classes_[s], static_cast<uint32_t>(c))) add_state(ascii_[static_cast<size_t>(c)], s);
    }
  }

  // Match distances: a match more than `states_` away repeats a state, so some loop lies on the
  // way and matches come arbitrarily far on; below 2 * states_ every such loop shows.
  const int64_t lengths = std::max<int64_t>(2 * states_, states_ + std::min(length_horizon, kMaxLengthHorizon) + 1);
  exactly_.assign(static_cast<size_t>(lengths), States{});
  exactly_[0] = accepting_;
  for (size_t length = 1; length < exactly_.size(); ++length) {
    for (int s = 0; s < states_; ++s) {
      if (intersects(follow_[s], exactly_[length - 1])) add_state(exactly_[length], s);
    }
  }
  for (int64_t length = states_; length < 2 * states_; ++length) unbounded_ = union_of(unbounded_, exactly_[length]);
}

States JsonRegex::step(const States& states, uint32_t c) const {
  States next{};
  for_each_state(states, [&](int s) { next = union_of(next, follow_[s]); });
  if (c < 128) return States{next[0] & ascii_[c][0], next[1] & ascii_[c][1]};
  States kept{};
  for_each_state(next, [&](int s) {
    if (class_holds(classes_[s], c)) add_state(kept, s);
  });
  return kept;
}

bool JsonRegex::can_step_within(const States& states, uint32_t lo, uint32_t hi, int64_t at_least,
                                int64_t at_most) const {
  if (at_most == 0) return false;  // no room for the code point itself
  States next{};
  for_each_state(states, [&](int s) { next = union_of(next, follow_[s]); });
  bool found = false;
  for_each_state(next, [&](int s) {
    if (found) return;
    const Ranges& ranges = classes_[s];
    const auto it = std::partition_point(ranges.begin(), ranges.end(), [&](const auto& r) { return r.second < lo; });
    if (it == ranges.end() || it->first > hi) return;
    States one{};
    add_state(one, s);
    found = (at_least <= 1 && at_most < 0) || can_match_within(one, at_least - 1, at_most < 0 ? -1 : at_most - 1);
  });
  return found;
}

bool JsonRegex::can_match_within(const States& states, int64_t at_least, int64_t at_most) const {
  if (at_most < 0 && intersects(states, unbounded_)) return true;
  const int64_t last = std::min<int64_t>(at_most < 0 ? INT64_MAX : at_most, static_cast<int64_t>(exactly_.size()) - 1);
  for (int64_t length = std::max<int64_t>(at_least, 0); length <= last; ++length) {
    if (intersects(states, exactly_[static_cast<size_t>(length)])) return true;
  }
  return false;
}

}  // namespace serve
}  // namespace dschat
