#pragma once
// Exact decimals for the bounds of a JSON Schema `number` (minimum, maximum and their exclusive
// forms) in schema-guided decoding: a bound is held as its shortest round-trip decimal, the number
// being written as the decimal of its digits so far, and the two compared exactly.
//
// Why exact decimals answer what a validator's doubles answer: the machine writes bounded numbers
// with at most kMaxSignificant (15) significant digits and no exponent, and 15-digit decimals
// convert to distinct doubles in the same order; a bound's shortest decimal has no shorter decimal
// converting to its double. So x < bound as decimals exactly when double(x) < bound, and likewise
// for <=, ==: the reply validates with the same comparisons a validator makes on doubles.

#include <cstdint>

namespace dschat {
namespace serve {

struct JsonDecimal {
  static constexpr int kMaxSignificant = 15;
  bool negative = false;
  uint64_t mantissa = 0;  // < 10^17
  int32_t exponent = 0;   // value = (negative ? -1 : 1) * mantissa * 10^exponent
};

/// -1, 0 or 1 as a < b, a == b, a > b (a zero's sign is ignored).
int compare_decimals(const JsonDecimal& a, const JsonDecimal& b);

/// One end of an interval of decimals: a value, or no end at all.
struct JsonDecimalEnd {
  JsonDecimal value;
  bool closed = true;
  bool infinite = false;
};

/// Whether [from, to] (each end closed or open, or infinite) holds some decimal of both intervals.
bool decimal_intervals_meet(const JsonDecimalEnd& from_a, const JsonDecimalEnd& to_a, const JsonDecimalEnd& from_b,
                            const JsonDecimalEnd& to_b);

}  // namespace serve
}  // namespace dschat
