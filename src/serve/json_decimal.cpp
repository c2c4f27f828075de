#include "serve/json_decimal.h"

namespace dschat {
namespace serve {
namespace {

int digit_count(uint64_t value) {
  int digits = 0;
  for (; value != 0; value /= 10) ++digits;
  return digits;
}

int compare_magnitudes(uint64_t a, int32_t a_exponent, uint64_t b, int32_t b_exponent) {
  if (a == 0 || b == 0) return static_cast<int>(a != 0) - static_cast<int>(b != 0);
  // Orders of magnitude first; equal ones leave exponents at most 19 apart, within 128 bits.
  const int64_t a_order = int64_t{digit_count(a)} + a_exponent, b_order = int64_t{digit_count(b)} + b_exponent;
  if (a_order != b_order) return a_order < b_order ? -1 : 1;
  unsigned __int128 x = a, y = b;
  for (int32_t i = a_exponent; i > b_exponent; --i) x *= 10;
  for (int32_t i = b_exponent; i > a_exponent; --i) y *= 10;
  return x < y ? -1 : x > y ? 1 : 0;
}

// The greater of two lower ends (closed only where both are, when they are equal).
JsonDecimalEnd higher_start(const JsonDecimalEnd& a, const JsonDecimalEnd& b) {
  if (a.infinite) return b;
  if (b.infinite) return a;
  const int order = compare_decimals(a.value, b.value);
  if (order != 0) return order > 0 ? a : b;
  JsonDecimalEnd end = a;
  end.closed = a.closed && b.closed;
  return end;
}

// The smaller of two upper ends.
JsonDecimalEnd lower_finish(const JsonDecimalEnd& a, const JsonDecimalEnd& b) {
  if (a.infinite) return b;
  if (b.infinite) return a;
  const int order = compare_decimals(a.value, b.value);
  if (order != 0) return order < 0 ? a : b;
  JsonDecimalEnd end = a;
  end.closed = a.closed && b.closed;
  return end;
}

}  // namespace

int compare_decimals(const JsonDecimal& a, const JsonDecimal& b) {
  const bool a_negative = a.negative && a.mantissa != 0, b_negative = b.negative && b.mantissa != 0;
  if (a_negative != b_negative) return a_negative ? -1 : 1;
  const int order = compare_magnitudes(a.mantissa, a.exponent, b.mantissa, b.exponent);
  return a_negative ? -order : order;
}

bool decimal_intervals_meet(const JsonDecimalEnd& from_a, const JsonDecimalEnd& to_a, const JsonDecimalEnd& from_b,
                            const JsonDecimalEnd& to_b) {
  const JsonDecimalEnd from = higher_start(from_a, from_b), to = lower_finish(to_a, to_b);
  if (from.infinite || to.infinite) return true;
  const int order = compare_decimals(from.value, to.value);
  return order < 0 || (order == 0 && from.closed && to.closed);
}

}  // namespace serve
}  // namespace dschat
