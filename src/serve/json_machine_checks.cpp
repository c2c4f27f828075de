// JsonMachine's reading of strings and integers whose nodes have keywords (json_machine.h):
// code points counted and stepped through the string's pattern, an integer's digits only while a
// value in bounds can still follow.
#include "serve/json_machine.h"

#include <algorithm>

namespace dschat {
namespace serve {
namespace {

constexpr uint32_t kUnicodeLast = 0x10FFFF;

// The code points a string may still write when \u escapes can give [lo, hi]: surrogates cannot
// be escaped into a checked string (a lone one is no character; a pair is one it would write as
// UTF-8 instead).
template <typename F>
bool any_escapable(uint32_t lo, uint32_t hi, F&& can) {
  return (lo < 0xD800 && can(lo, std::min<uint32_t>(hi, 0xD7FF))) ||
         (hi > 0xDFFF && can(std::max<uint32_t>(lo, 0xE000), hi));
}

}  // namespace

// Whether some code point in [lo, hi] can be the string's next one: within maxLength, and (with a
// pattern) one its states can step on with a match still in reach of the length bounds.
bool JsonMachine::string_may_take(const Path& path, uint32_t lo, uint32_t hi) const {
  const JsonSchemaNode& node = at(path.checked_node);
  if (node.max_length >= 0 && path.chars >= node.max_length) return false;
  if (node.pattern < 0) return true;
  const int64_t left = node.max_length < 0 ? -1 : node.max_length - path.chars;
  return schema_->patterns[static_cast<size_t>(node.pattern)].can_step_within(path.pattern, lo, hi,
                                                                              node.min_length - path.chars, left);
}

int64_t JsonMachine::length_only_string_room() const {
  if (count_ != 1) return -1;
  const Path& path = paths_[0];
  if (path.mode != Mode::kString || path.checked_node < 0 || path.utf8_left != 0) return -1;
  const JsonSchemaNode& node = at(path.checked_node);
  if (node.pattern >= 0) return -1;
  return node.max_length < 0 ? INT64_MAX : node.max_length - static_cast<int64_t>(path.chars);
}

JsonMachine::Step JsonMachine::checked_string(Path& path, char c) const {
  const auto byte = static_cast<unsigned char>(c);
  if (path.utf8_left > 0) {  // a continuation byte of a character being decoded
    if (byte < path.utf8_lo || byte > path.utf8_hi) return Step::kRefused;
    path.code_point = (path.code_point << 6) | (byte & 0x3F);
    path.utf8_lo = 0x80;
    path.utf8_hi = 0xBF;
    if (--path.utf8_left == 0) return string_char(path, path.code_point);
    return utf8_may_go_on(path) ? Step::kTaken : Step::kRefused;
  }
  if (c == '"') {
    const JsonSchemaNode& node = at(path.checked_node);
    if (path.chars < node.min_length) return Step::kRefused;
    if (node.pattern >= 0 && !schema_->patterns[static_cast<size_t>(node.pattern)].matches(path.pattern)) {
      return Step::kRefused;
    }
    value_done(path);
    return Step::kTaken;
  }
  if (c == '\\') {
    path.mode = Mode::kEscape;
    return any_escapable(0, 0xFFFF, [&](uint32_t lo, uint32_t hi) { return string_may_take(path, lo, hi); })
               ? Step::kTaken
               : Step::kRefused;
  }
  if (byte < 0x20) return Step::kRefused;  // control characters must be escaped
  if (byte < 0x80) return string_char(path, byte);
  // A lead byte, and the range its next byte must fall in (no overlong forms, no surrogates,
  // nothing past U+10FFFF: what a UTF-8 decoder accepts).
  if (byte >= 0xC2 && byte <= 0xDF) {
    path.utf8_left = 1;
    path.code_point = byte & 0x1F;
    path.utf8_lo = 0x80;
    path.utf8_hi = 0xBF;
  } else if (byte >= 0xE0 && byte <= 0xEF) {
    path.utf8_left = 2;
    path.code_point = byte & 0x0F;
    path.utf8_lo = byte == 0xE0 ? 0xA0 : 0x80;
    path.utf8_hi = byte == 0xED ? 0x9F : 0xBF;
  } else if (byte >= 0xF0 && byte <= 0xF4) {
    path.utf8_left = 3;
    path.code_point = byte & 0x07;
    path.utf8_lo = byte == 0xF0 ? 0x90 : 0x80;
    path.utf8_hi = byte == 0xF4 ? 0x8F : 0xBF;
  } else {
    return Step::kRefused;
  }
  return utf8_may_go_on(path) ? Step::kTaken : Step::kRefused;
}

// Mid-character: the code points the remaining bytes can still make.
bool JsonMachine::utf8_may_go_on(const Path& path) const {
  const int rest = 6 * (path.utf8_left - 1);  // bits of the bytes after the next one
  const uint32_t lo = ((path.code_point << 6) | (path.utf8_lo & 0x3F)) << rest;
  const uint32_t hi = (((path.code_point << 6) | (path.utf8_hi & 0x3F)) << rest) | ((1u << rest) - 1);
  return string_may_take(path, lo, std::min(hi, kUnicodeLast));
}

// After a backslash in a checked string: the escaped character is one code point.
JsonMachine::Step JsonMachine::escaped(Path& path, char c) const {
  path.mode = Mode::kString;
  switch (c) {
    case '"': return string_char(path, '"');
    case '\\': return string_char(path, '\\');
    case '/': return string_char(path, '/');
    case 'b': return string_char(path, '\b');
    case 'f': return string_char(path, '\f');
    case 'n': return string_char(path, '\n');
    case 'r': return string_char(path, '\r');
    case 't': return string_char(path, '\t');
    case 'u':
      path.mode = Mode::kUnicode;
      path.hex_left = 4;
      path.code_point = 0;
      return unicode_may_go_on(path) ? Step::kTaken : Step::kRefused;
    default: return Step::kRefused;
  }
}

// Inside \uXXXX: the code points the remaining hex digits can still make.
bool JsonMachine::unicode_may_go_on(const Path& path) const {
  const int rest = 4 * path.hex_left;
  const uint32_t lo = path.code_point << rest, hi = lo | ((1u << rest) - 1);
  return any_escapable(lo, hi, [&](uint32_t a, uint32_t b) { return string_may_take(path, a, b); });
}

JsonMachine::Step JsonMachine::string_char(Path& path, uint32_t code_point) const {
  const JsonSchemaNode& node = at(path.checked_node);
  if (node.max_length >= 0 && path.chars >= node.max_length) return Step::kRefused;
  ++path.chars;
  if (node.pattern < 0) return Step::kTaken;
  const JsonRegex& regex = schema_->patterns[static_cast<size_t>(node.pattern)];
  const JsonRegex::States next = regex.step(path.pattern, code_point);
  if (JsonRegex::empty(next)) return Step::kRefused;
  if ((node.min_length > 0 || node.max_length >= 0) &&
      !regex.can_match_within(next, node.min_length - path.chars,
                              node.max_length < 0 ? -1 : node.max_length - path.chars)) {
    return Step::kRefused;
  }
  path.pattern = next;
  return Step::kTaken;
}

// One more digit of a bounded integer (the caller checked the digit bound).
JsonMachine::Step JsonMachine::integer_digit(Path& path, char c) const {
  const uint64_t digit = static_cast<uint64_t>(c - '0');
  path.magnitude = path.magnitude > (UINT64_MAX - digit) / 10 ? UINT64_MAX : path.magnitude * 10 + digit;
  return integer_reachable(path) ? Step::kTaken : Step::kRefused;
}

// Whether the integer read so far ("-", or a sign and digits) can still end in bounds: as it is,
// or with m more digits ([magnitude * 10^m, (magnitude + 1) * 10^m - 1]).
bool JsonMachine::integer_reachable(const Path& path) const {
  const JsonSchemaNode& node = at(path.checked_node);
  using Wide = __int128;
  const auto fits = [&](Wide from, Wide to) {  // magnitudes [from, to]: some integer in bounds among them
    const Wide lo = std::max<Wide>(path.negative ? -to : from, node.minimum);
    const Wide hi = std::min<Wide>(path.negative ? -from : to, node.maximum);
    if (lo > hi) return false;
    if (node.multiple_of == 0) return true;
    Wide quotient = lo / node.multiple_of;  // the first multiple at or above lo
    if (quotient * node.multiple_of < lo) ++quotient;
    return quotient * node.multiple_of <= hi;
  };
  const bool any_digits = path.number != Number::kMinus;
  if (!any_digits) return fits(0, Wide{INT64_MAX} + 1);
  const Wide magnitude = path.magnitude;
  if (fits(magnitude, magnitude)) return true;
  if (magnitude == 0) return false;  // "0" and "-0" take no more digits
  Wide from = magnitude, to = magnitude;
  for (int more = path.digits + 1; more <= kMaxDigits && from <= Wide{UINT64_MAX}; ++more) {
    from *= 10;
    to = to * 10 + 9;
    if (fits(from, to)) return true;
  }
  return false;
}

bool JsonMachine::integer_in_bounds(const Path& path) const {
  const JsonSchemaNode& node = at(path.checked_node);
  const __int128 value = path.negative ? -static_cast<__int128>(path.magnitude) : path.magnitude;
  return value >= node.minimum && value <= node.maximum &&
         (node.multiple_of == 0 || value % node.multiple_of == 0);
}

// A bounded number (json_decimal.h): no exponent, at most 15 significant digits.
JsonMachine::Step JsonMachine::bounded_number(Path& path, char c) const {
  const bool digit = c >= '0' && c <= '9';
  switch (path.number) {
    case Number::kMinus:
      if (!digit) return Step::kRefused;
      path.number = c == '0' ? Number::kZero : Number::kInt;
      return number_digit(path, c, false);
    case Number::kZero:
    case Number::kInt:
      if (digit && path.number == Number::kInt) return number_digit(path, c, false);
      if (c != '.') return end_then(path, c);
      if (path.significant >= JsonDecimal::kMaxSignificant) return Step::kRefused;  // no digit could follow
      path.number = Number::kDot;
      return number_reachable(path) ? Step::kTaken : Step::kRefused;
    case Number::kDot:
      if (!digit) return Step::kRefused;
      path.number = Number::kFraction;
      return number_digit(path, c, true);
    case Number::kFraction:
      return digit ? number_digit(path, c, true) : end_then(path, c);
    default:
      return Step::kRefused;
  }
}

JsonMachine::Step JsonMachine::number_digit(Path& path, char c, bool fraction) const {
  const uint64_t digit = static_cast<uint64_t>(c - '0');
  const bool leading_zero = path.magnitude == 0 && digit == 0;  // 0.00...: not significant
  if (!leading_zero && path.significant >= JsonDecimal::kMaxSignificant) return Step::kRefused;
  uint8_t& run = fraction ? path.fraction_digits : path.digits;
  if (run >= kMaxDigits) return Step::kRefused;
  ++run;
  path.magnitude = path.magnitude * 10 + digit;
  if (path.magnitude != 0) ++path.significant;
  return number_reachable(path) ? Step::kTaken : Step::kRefused;
}

namespace {

JsonDecimalEnd decimal_end(bool negative, uint64_t mantissa, int32_t exponent, bool closed) {
  JsonDecimalEnd end;
  end.value = JsonDecimal{negative, mantissa, exponent};
  end.closed = closed;
  return end;
}

}  // namespace

// Whether some number in bounds begins with the text so far: the number as it is (where it may
// end), or a longer one, whose magnitudes fill [m, m + 1) * 10^e for the digits m so far (e: the
// digits still to come before the point, or minus those after it).
bool JsonMachine::number_reachable(const Path& path) const {
  const JsonSchemaNode& node = at(path.checked_node);
  const bool negative = path.negative;
  // Magnitudes [lo, hi) as a signed interval meeting the bounds.
  const auto meets = [&](uint64_t lo, uint64_t hi, int32_t exponent) {
    const JsonDecimalEnd low = decimal_end(false, lo, exponent, true), high = decimal_end(false, hi, exponent, false);
    if (!negative) return decimal_intervals_meet(low, high, node.number_from, node.number_to);
    return decimal_intervals_meet(decimal_end(true, hi, exponent, false), decimal_end(true, lo, exponent, true),
                                  node.number_from, node.number_to);
  };
  if (path.number == Number::kMinus) {  // any magnitude
    JsonDecimalEnd none;
    none.infinite = true;
    return decimal_intervals_meet(none, decimal_end(true, 0, 0, true), node.number_from, node.number_to);
  }
  const uint64_t m = path.magnitude;
  const int32_t exponent = -static_cast<int32_t>(path.fraction_digits);
  const int budget = JsonDecimal::kMaxSignificant - path.significant;
  if (number_whole(path) && number_in_bounds(path)) return true;
  const bool more_fraction = path.number == Number::kDot || path.fraction_digits < kMaxDigits;
  if (budget > 0 && more_fraction && meets(m, m + 1, exponent)) return true;  // more digits after the point
  if (path.number != Number::kInt) return false;
  uint64_t lo = m, hi = m + 1;
  for (int more = 1; more <= budget && path.digits + more <= kMaxDigits; ++more) {  // more digits before it
    lo *= 10;
    hi *= 10;
    if (meets(lo, hi, 0)) return true;
  }
  return false;
}

bool JsonMachine::number_in_bounds(const Path& path) const {
  const JsonSchemaNode& node = at(path.checked_node);
  const JsonDecimalEnd value =
      decimal_end(path.negative, path.magnitude, -static_cast<int32_t>(path.fraction_digits), true);
  return decimal_intervals_meet(value, value, node.number_from, node.number_to);
}

}  // namespace serve
}  // namespace dschat
