#include "serve/json_schema_scalars.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <map>

#include "serve/openai_protocol.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace serve {
namespace detail {
namespace {

using SchemaJson = nlohmann::ordered_json;

// RFC 3339's date and time (what JSON Schema's formats name), as patterns the byte machine
// follows: only real dates (no February 29: a year's leap is not a pattern's business), no leap
// second, 'T' and 'Z' in capitals, at most 6 fraction digits; the rest as their checkers take them.
const std::string kYear = "(?:[1-9]\\d{3}|0[1-9]\\d{2}|00[1-9]\\d|000[1-9])";
const std::string kDate = kYear + "-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)"
                                  "|02-(?:0[1-9]|1\\d|2[0-8]))";
const std::string kTime = "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,6})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)";
const std::string kOctet = "(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
const std::string kHexDigit = "[0-9a-fA-F]";
// RFC 3986's URIs of the web's schemes with a host name: pchar is a path character or a
// percent-encoded byte.
const std::string kUriLabel = "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?";
const std::string kUriChar = "(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})";
const std::string kUri = "^(?:https?|ftp)://" + kUriLabel + "(?:\\." + kUriLabel + ")*(?::[0-9]{1,5})?(?:/" + kUriChar +
                         "*)*(?:\\?(?:" + kUriChar + "|[/?])*)?(?:#(?:" + kUriChar + "|[/?])*)?$";

const std::map<std::string, std::string>& format_patterns() {
  static const std::map<std::string, std::string> patterns = {
      {"date", "^" + kDate + "$"},
      {"time", "^" + kTime + "$"},
      {"date-time", "^" + kDate + "T" + kTime + "$"},
      {"uuid", "^" + kHexDigit + "{8}-" + kHexDigit + "{4}-" + kHexDigit + "{4}-" + kHexDigit + "{4}-" + kHexDigit +
                   "{12}$"},
      {"email", "^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\\.[A-Za-z0-9-]+)*\\.[A-Za-z]{2,}$"},
      {"ipv4", "^(?:" + kOctet + "\\.){3}" + kOctet + "$"},
      {"uri", kUri},
  };
  return patterns;
}

// The pattern a string must match and the key path that gave it ("" when none): `pattern` or the
// pattern of `format`.
std::string string_pattern(const SchemaJson& schema, const std::string& where, std::string& pattern_where) {
  if (schema.contains("pattern") && schema.contains("format")) {
    throw bad_key(where + ".format", "together with pattern is not supported: give one of them");
  }
  if (schema.contains("pattern")) {
    if (!schema["pattern"].is_string()) throw bad_key(where + ".pattern", "must be a string");
    pattern_where = where + ".pattern";
    return schema["pattern"].get<std::string>();
  }
  if (schema.contains("format")) {
    const SchemaJson& format = schema["format"];
    const auto found = format.is_string() ? format_patterns().find(format.get<std::string>()) : format_patterns().end();
    if (found == format_patterns().end()) {
      throw bad_key(where + ".format", "is " + format.dump() + ", which schema-guided decoding does not follow "
                                           "(it follows date, time, date-time, uuid, email, ipv4 and uri)");
    }
    pattern_where = where + ".format";
    return found->second;
  }
  return "";
}

// A bound of a number keyword, as a long double (exact for every int64 and every double).
long double number_bound(const SchemaJson& schema, const std::string& key, const std::string& where) {
  const SchemaJson& value = schema[key];
  if (!value.is_number() || (value.is_number_float() && !std::isfinite(value.get<double>()))) {
    throw bad_key(where + "." + key, "must be a finite number");
  }
  if (value.is_number_unsigned()) return static_cast<long double>(value.get<uint64_t>());
  if (value.is_number_integer()) return static_cast<long double>(value.get<int64_t>());
  return static_cast<long double>(value.get<double>());
}

// A number bound as its shortest round-trip decimal (json_decimal.h), at most 15 significant digits.
JsonDecimal decimal_bound(const SchemaJson& schema, const std::string& key, const std::string& where) {
  const long double exact = number_bound(schema, key, where);
  std::string text;
  if (schema[key].is_number_float()) {
    char buffer[64];
    const auto result = std::to_chars(buffer, buffer + sizeof(buffer), schema[key].get<double>());
    text.assign(buffer, result.ptr);
  } else {
    text = schema[key].dump();
  }
  JsonDecimal decimal;
  decimal.negative = exact < 0;
  std::string digits;
  int32_t exponent = 0;
  bool fraction = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      digits += c;
      if (fraction) --exponent;
    } else if (c == '.') {
      fraction = true;
    } else if (c == 'e' || c == 'E') {
      exponent += static_cast<int32_t>(std::stol(text.substr(i + 1)));
      break;
    }
  }
  digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
  while (!digits.empty() && digits.back() == '0') {
    digits.pop_back();
    ++exponent;
  }
  if (digits.size() > static_cast<size_t>(JsonDecimal::kMaxSignificant)) {
    throw bad_key(where + "." + key, "has more than " + std::to_string(JsonDecimal::kMaxSignificant) +
                                         " significant digits, past what the written numbers hold");
  }
  decimal.mantissa = digits.empty() ? 0 : std::stoull(digits);
  decimal.exponent = digits.empty() ? 0 : exponent;
  return decimal;
}

void compile_number_bounds(const SchemaJson& schema, const std::string& where, JsonSchemaNode& leaf) {
  JsonDecimalEnd from, to;
  from.infinite = to.infinite = true;
  for (const std::string& key : kNumberKeywords) {
    if (!schema.contains(key)) continue;
    JsonDecimalEnd end;
    end.value = decimal_bound(schema, key, where);
    end.closed = key == "minimum" || key == "maximum";
    JsonDecimalEnd& kept = key == "minimum" || key == "exclusiveMinimum" ? from : to;
    const int order = kept.infinite ? 0 : compare_decimals(end.value, kept.value);
    const bool tighter = kept.infinite || (&kept == &from ? order > 0 : order < 0) || (order == 0 && !end.closed);
    if (tighter) kept = end;
  }
  JsonDecimalEnd none;
  none.infinite = true;
  if (!decimal_intervals_meet(from, to, none, none)) {
    throw bad_key(where, "allows no number between its minimum and maximum");
  }
  leaf.bounded = true;
  leaf.number_from = from;
  leaf.number_to = to;
}

void compile_integer_bounds(const SchemaJson& schema, const std::string& where, JsonSchemaNode& leaf) {
  // Integers in [lo, hi], as long doubles (exact here) clamped to int64's range.
  long double lo = static_cast<long double>(std::numeric_limits<int64_t>::min());
  long double hi = static_cast<long double>(std::numeric_limits<int64_t>::max());
  bool any = false;
  if (schema.contains("multipleOf")) {
    const long double step = number_bound(schema, "multipleOf", where);
    if (step <= 0 || step != std::floor(step) || step > static_cast<long double>(int64_t{1} << 62)) {
      throw bad_key(where + ".multipleOf", "must be a positive integer (up to 2^62) on an integer");
    }
    leaf.multiple_of = static_cast<int64_t>(step);
    any = true;
  }
  for (const std::string& key : kNumberKeywords) {
    if (!schema.contains(key)) continue;
    any = true;
    const long double bound = number_bound(schema, key, where);
    if (key == "minimum") lo = std::max(lo, std::ceil(bound));
    if (key == "exclusiveMinimum") lo = std::max(lo, std::floor(bound) + 1);
    if (key == "maximum") hi = std::min(hi, std::floor(bound));
    if (key == "exclusiveMaximum") hi = std::min(hi, std::ceil(bound) - 1);
  }
  if (!any) return;
  if (lo > hi) throw bad_key(where, "allows no integer between its minimum and maximum");
  __int128 first = static_cast<int64_t>(lo), last = static_cast<int64_t>(hi);
  if (leaf.multiple_of > 0) {  // the first and last multiples within the bounds
    const __int128 step = leaf.multiple_of;
    __int128 quotient = first / step;  // rounded towards zero
    if (quotient * step < first) ++quotient;
    first = quotient * step;
    quotient = last / step;
    if (quotient * step > last) --quotient;
    last = quotient * step;
  }
  if (first > last) throw bad_key(where, "allows no integer between its minimum and maximum");
  leaf.bounded = true;
  leaf.minimum = static_cast<int64_t>(first);
  leaf.maximum = static_cast<int64_t>(last);
}

}  // namespace

int64_t count_keyword(const SchemaJson& schema, const char* key, int64_t fallback, const std::string& where) {
  if (!schema.contains(key)) return fallback;
  const SchemaJson& value = schema[key];
  if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > 65535) {
    throw bad_key(where + "." + key, "must be an integer in [0, 65535]");
  }
  return value.get<int64_t>();
}

const std::vector<std::string> kStringKeywords = {"minLength", "maxLength", "pattern", "format"};
const std::vector<std::string> kNumberKeywords = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

void compile_string_keywords(const SchemaJson& schema, const std::string& where, JsonSchemaNode& leaf,
                             std::vector<JsonRegex>& patterns) {
  leaf.min_length = count_keyword(schema, "minLength", 0, where);
  leaf.max_length = count_keyword(schema, "maxLength", -1, where);
  if (leaf.max_length >= 0 && leaf.max_length < leaf.min_length) {
    throw bad_key(where + ".maxLength", "is below minLength");
  }
  std::string pattern_where;
  const std::string pattern = string_pattern(schema, where, pattern_where);
  if (pattern_where.empty()) return;
  const int64_t horizon = std::max(leaf.min_length, leaf.max_length);
  if (horizon > JsonRegex::kMaxLengthHorizon) {
    throw bad_key(where + (leaf.max_length >= 0 ? ".maxLength" : ".minLength"),
                      "beside a pattern or format may be at most " + std::to_string(JsonRegex::kMaxLengthHorizon));
  }
  JsonRegex regex(pattern, pattern_where, horizon);
  if (!regex.can_match_within(JsonRegex::start(), leaf.min_length, leaf.max_length)) {
    throw bad_key(pattern_where, "matches no string of minLength to maxLength code points");
  }
  leaf.pattern = static_cast<int32_t>(patterns.size());
  patterns.push_back(std::move(regex));
}

void compile_number_keywords(const SchemaJson& schema, const std::string& where, JsonSchemaNode& leaf) {
  bool any = schema.contains("multipleOf");
  for (const std::string& key : kNumberKeywords) any = any || schema.contains(key);
  if (!any) return;
  if (leaf.kind == JsonSchemaNode::Kind::kNumber) return compile_number_bounds(schema, where, leaf);
  compile_integer_bounds(schema, where, leaf);
}

bool keeps_scalar_keywords(const SchemaJson& value, const SchemaJson& schema, const std::string& where) {
  if (value.is_string()) {
    JsonSchemaNode leaf;
    std::vector<JsonRegex> patterns;
    compile_string_keywords(schema, where, leaf, patterns);
    // nlohmann keeps strings as the UTF-8 it checked on parsing.
    const std::string& text = value.get_ref<const std::string&>();
    const auto length = static_cast<int64_t>(tokenizer::count_code_points(text));
    if (length < leaf.min_length || (leaf.max_length >= 0 && length > leaf.max_length)) return false;
    if (patterns.empty()) return true;
    JsonRegex::States states = JsonRegex::start();
    for (size_t at = 0; at < text.size();) states = patterns[0].step(states, tokenizer::next_code_point(text, at));
    return patterns[0].matches(states);
  }
  if (!value.is_number()) return true;
  const long double number = value.is_number_float() ? static_cast<long double>(value.get<double>())
                             : value.is_number_unsigned() ? static_cast<long double>(value.get<uint64_t>())
                                                          : static_cast<long double>(value.get<int64_t>());
  for (const std::string& key : kNumberKeywords) {
    if (!schema.contains(key)) continue;
    const long double bound = number_bound(schema, key, where);
    const bool kept = key == "minimum" ? number >= bound : key == "maximum" ? number <= bound
                      : key == "exclusiveMinimum" ? number > bound : number < bound;
    if (!kept) return false;
  }
  if (schema.contains("multipleOf")) {
    const long double step = number_bound(schema, "multipleOf", where);
    if (step <= 0 || std::fmod(number, step) != 0) return false;
  }
  return true;
}

}  // namespace detail
}  // namespace serve
}  // namespace dschat
