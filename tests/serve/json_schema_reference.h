#pragma once
// The reference the schema-guided decoding tests compare against: JSON Schema's validation of a
// parsed value, written here as the specification defines it (a recursive check, no byte machine;
// patterns through std::wregex, ECMAScript, the dialect JSON Schema names; formats checked field
// by field as RFC 3339 and the format checkers have them), and a generator of texts a schema
// allows as the machine reads them (keys in the schema's order, random blanks between tokens).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <regex>
#include <string>

namespace dschat {
namespace serve {
namespace reference {

using Json = nlohmann::ordered_json;

inline std::u32string code_points(const std::string& utf8) {
  std::u32string out;
  for (size_t i = 0; i < utf8.size();) {
    const auto lead = static_cast<unsigned char>(utf8[i++]);
    const int extra = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
    uint32_t value = extra == 0 ? lead : lead & (0x3F >> extra);
    for (int k = 0; k < extra && i < utf8.size(); ++k) {
      value = (value << 6) | (static_cast<unsigned char>(utf8[i++]) & 0x3F);
    }
    out.push_back(static_cast<char32_t>(value));
  }
  return out;
}

inline bool digits_at(const std::string& s, size_t from, size_t count) {
  if (from + count > s.size()) return false;
  for (size_t i = from; i < from + count; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return true;
}

inline int number_at(const std::string& s, size_t from, size_t count) { return std::stoi(s.substr(from, count)); }

inline bool is_date(const std::string& s) {
  if (s.size() != 10 || !digits_at(s, 0, 4) || s[4] != '-' || !digits_at(s, 5, 2) || s[7] != '-' ||
      !digits_at(s, 8, 2)) {
    return false;
  }
  const int year = number_at(s, 0, 4), month = number_at(s, 5, 2), day = number_at(s, 8, 2);
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return year >= 1 && month >= 1 && month <= 12 && day >= 1 && day <= kDays[month - 1] + (month == 2 && leap);
}

// RFC 3339's full-time: HH:MM:SS, a fraction, then Z or an offset.
inline bool is_time(const std::string& s) {
  if (s.size() < 9 || !digits_at(s, 0, 2) || s[2] != ':' || !digits_at(s, 3, 2) || s[5] != ':' || !digits_at(s, 6, 2)) {
    return false;
  }
  if (number_at(s, 0, 2) > 23 || number_at(s, 3, 2) > 59 || number_at(s, 6, 2) > 60) return false;
  size_t at = 8;
  if (s[at] == '.') {
    const size_t from = ++at;
    while (at < s.size() && s[at] >= '0' && s[at] <= '9') ++at;
    if (at == from) return false;
  }
  const std::string zone = s.substr(at);
  if (zone == "Z" || zone == "z") return true;
  return zone.size() == 6 && (zone[0] == '+' || zone[0] == '-') && digits_at(zone, 1, 2) && zone[3] == ':' &&
         digits_at(zone, 4, 2) && number_at(zone, 1, 2) <= 23 && number_at(zone, 4, 2) <= 59;
}

inline bool is_format(const std::string& format, const std::string& s) {
  if (format == "date") return is_date(s);
  if (format == "time") return is_time(s);
  if (format == "date-time") return s.size() > 11 && (s[10] == 'T' || s[10] == 't') && is_date(s.substr(0, 10)) &&
                                    is_time(s.substr(11));
  if (format == "uuid") {
    if (s.size() != 36) return false;
    for (size_t i = 0; i < 36; ++i) {
      const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
      if (dash ? s[i] != '-' : !std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
    }
    return true;
  }
  if (format == "email") {
    const size_t at = s.find('@');
    return at != std::string::npos && at > 0 && at + 1 < s.size() && s.find('@', at + 1) == std::string::npos;
  }
  if (format == "uri") {  // RFC 3986: a scheme, ':', then URI characters and %-encoded bytes
    const size_t colon = s.find(':');
    if (colon == std::string::npos || colon == 0 || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
    for (size_t i = 0; i < colon; ++i) {
      if (!std::isalnum(static_cast<unsigned char>(s[i])) && s[i] != '+' && s[i] != '-' && s[i] != '.') return false;
    }
    static const std::string kUriCharacters = "-._~:/?#[]@!$&'()*+,;=";
    for (size_t i = colon + 1; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c == '%') {
        if (i + 2 >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + 1])) ||
            !std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
          return false;
        }
        i += 2;
      } else if (!std::isalnum(c) && kUriCharacters.find(static_cast<char>(c)) == std::string::npos) {
        return false;
      }
    }
    return true;
  }
  if (format == "ipv4") {
    size_t at = 0;
    for (int octet = 0; octet < 4; ++octet) {
      size_t end = at;
      while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
      const size_t length = end - at;
      if (length == 0 || length > 3 || (length > 1 && s[at] == '0') || number_at(s, at, length) > 255) return false;
      if (octet < 3 && (end >= s.size() || s[end] != '.')) return false;
      at = end + 1;
    }
    return at == s.size() + 1;
  }
  return false;
}

inline bool of_type(const Json& value, const std::string& type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    return value.is_number_integer() || (value.is_number_float() && value == std::floor(value.get<double>()));
  }
  if (type == "boolean") return value.is_boolean();
  return type == "null" && value.is_null();
}

inline long double as_long_double(const Json& number) {
  if (number.is_number_unsigned()) return static_cast<long double>(number.get<uint64_t>());
  if (number.is_number_integer()) return static_cast<long double>(number.get<int64_t>());
  return static_cast<long double>(number.get<double>());
}

inline bool keeps_scalar_keywords(const Json& value, const Json& schema) {
  if (value.is_string()) {
    const std::u32string points = code_points(value.get<std::string>());
    if (points.size() < schema.value("minLength", 0u) || points.size() > schema.value("maxLength", 1u << 30)) {
      return false;
    }
    if (schema.contains("pattern")) {
      const std::u32string pattern = code_points(schema["pattern"].get<std::string>());
      const std::wregex regex(std::wstring(pattern.begin(), pattern.end()), std::regex::ECMAScript);
      if (!std::regex_search(std::wstring(points.begin(), points.end()), regex)) return false;
    }
    return !schema.contains("format") || is_format(schema["format"].get<std::string>(), value.get<std::string>());
  }
  if (value.is_number()) {
    const long double number = as_long_double(value);
    if (schema.contains("minimum") && number < as_long_double(schema["minimum"])) return false;
    if (schema.contains("maximum") && number > as_long_double(schema["maximum"])) return false;
    if (schema.contains("exclusiveMinimum") && number <= as_long_double(schema["exclusiveMinimum"])) return false;
    if (schema.contains("exclusiveMaximum") && number >= as_long_double(schema["exclusiveMaximum"])) return false;
    if (schema.contains("multipleOf") && std::fmod(number, as_long_double(schema["multipleOf"])) != 0) return false;
  }
  return true;
}

// An array's item schemas: prefixItems then items (2020-12), or a list under items then
// additionalItems (drafts 4 to 2019-09).
inline Json tuple_prefix(const Json& schema) {
  if (schema.contains("items") && schema["items"].is_array()) return schema["items"];
  return schema.value("prefixItems", Json::array());
}

inline Json tuple_rest(const Json& schema) {
  if (schema.contains("items") && schema["items"].is_array()) return schema.value("additionalItems", Json(true));
  return schema.value("items", Json(true));
}

inline bool validates(const Json& value, const Json& schema, const Json& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    return validates(value, root.at(Json::json_pointer(schema["$ref"].get<std::string>().substr(1))), root);
  }
  if (schema.value("nullable", false) && value.is_null()) return true;
  for (const Json& branch : schema.value("allOf", Json::array())) {
    if (!validates(value, branch, root)) return false;
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!schema.contains(key)) continue;
    int matches = 0;
    for (const Json& branch : schema[key]) matches += validates(value, branch, root);
    if (std::string(key) == "anyOf" ? matches == 0 : matches != 1) return false;
  }
  if (schema.contains("type")) {
    const Json types = schema["type"].is_array() ? schema["type"] : Json::array({schema["type"]});
    bool any = false;
    for (const Json& type : types) any = any || of_type(value, type.get<std::string>());
    if (!any) return false;
  }
  if (schema.contains("const") && value != schema["const"]) return false;
  if (schema.contains("enum")) {
    const Json& values = schema["enum"];
    if (std::find(values.begin(), values.end(), value) == values.end()) return false;
  }
  if (!keeps_scalar_keywords(value, schema)) return false;
  if (value.is_object()) {
    for (const Json& name : schema.value("required", Json::array())) {
      if (!value.contains(name.get<std::string>())) return false;
    }
    const Json properties = schema.value("properties", Json::object());
    for (const auto& [key, member] : value.items()) {
      const Json& rule = properties.contains(key) ? properties[key] : schema.value("additionalProperties", Json(true));
      if (!validates(member, rule, root)) return false;
    }
  }
  if (value.is_array()) {
    if (value.size() < schema.value("minItems", 0u) || value.size() > schema.value("maxItems", 1u << 30)) return false;
    const Json prefix = tuple_prefix(schema), rest = tuple_rest(schema);
    for (size_t i = 0; i < value.size(); ++i) {
      if (!validates(value[i], i < prefix.size() ? prefix[i] : rest, root)) return false;
    }
  }
  return true;
}

inline bool text_validates(const std::string& text, const Json& schema) {
  const Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return !value.is_discarded() && validates(value, schema, schema);
}

inline std::string quoted(const std::string& text) {
  return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
}

inline std::string blanks(std::mt19937& random) {
  static const char* const kBlanks[] = {"", "", "", " ", "\n", "  ", "\t", "\r\n"};
  return kBlanks[random() % 8];
}

// An integer within the schema's bounds (and within +-1000 of 0 where they allow).
inline std::string bounded_integer(const Json& schema, std::mt19937& random) {
  long double lo = -1000, hi = 1000;
  if (schema.contains("minimum")) lo = std::ceil(as_long_double(schema["minimum"]));
  if (schema.contains("exclusiveMinimum")) lo = std::floor(as_long_double(schema["exclusiveMinimum"])) + 1;
  if (schema.contains("maximum")) hi = std::floor(as_long_double(schema["maximum"]));
  if (schema.contains("exclusiveMaximum")) hi = std::ceil(as_long_double(schema["exclusiveMaximum"])) - 1;
  hi = std::min(hi, lo + 2000);
  const auto span = static_cast<uint64_t>(hi - lo + 1);
  return std::to_string(static_cast<long long>(lo) + static_cast<long long>(random() % span));
}

/// A value of `schema` as the machine reads them: keys in the schema's order, optional ones left
/// out at random, random blanks between tokens; a string with keywords is one of the schema's
/// "examples".
inline std::string instance(const Json& schema, const Json& root, std::mt19937& random, int depth) {
  if (schema.is_boolean() || schema.empty()) {  // any value
    static const char* const kAny[] = {"0", "-2.5e3", "\"s\"", "true", "null", "[1, {\"k\": []}]", "{}"};
    return kAny[random() % 7];
  }
  if (schema.contains("allOf")) {  // of one schema: it, with the keywords beside it
    Json merged = schema["allOf"][0];
    for (const auto& [key, value] : schema.items()) {
      if (key != "allOf") merged[key] = value;
    }
    return instance(merged, root, random, depth);
  }
  if (schema.contains("$ref")) {
    return instance(root.at(Json::json_pointer(schema["$ref"].get<std::string>().substr(1))), root, random, depth);
  }
  if (schema.value("nullable", false) && random() % 3 == 0) return "null";
  if (schema.contains("anyOf")) {
    return instance(schema["anyOf"][random() % schema["anyOf"].size()], root, random, depth);
  }
  if (schema.contains("const")) return schema["const"].dump();
  if (schema.contains("enum")) {
    Json kept = Json::array();
    for (const Json& value : schema["enum"]) {
      if (keeps_scalar_keywords(value, schema)) kept.push_back(value);
    }
    return kept[random() % kept.size()].dump();
  }
  if (schema.contains("examples")) return schema["examples"][random() % schema["examples"].size()].dump();
  std::string type = "object";
  if (schema.contains("type")) {
    const Json& types = schema["type"];
    type = types.is_array() ? types[random() % types.size()].get<std::string>() : types.get<std::string>();
  }
  static const char* const kStrings[] = {"\"\"", "\"Paris\"", "\"a \\\"q\\\" \\u00e9 \\n\"", "\"h\xc3\xa9llo\""};
  static const char* const kNumbers[] = {"0", "-0", "3.25", "-4.5e10", "6E-2", "7e+3", "12"};
  if (type == "string") return kStrings[random() % 4];
  if (type == "integer") return bounded_integer(schema, random);
  if (type == "number") return kNumbers[random() % 7];
  if (type == "boolean") return random() % 2 ? "true" : "false";
  if (type == "null") return "null";
  if (type == "array") {
    const Json prefix = tuple_prefix(schema), rest = tuple_rest(schema);
    size_t hi = std::min<size_t>(schema.value("maxItems", 4u), 4);
    if (rest == Json(false)) hi = std::min(hi, prefix.size());
    const size_t lo = schema.value("minItems", 0u);
    const size_t count = depth > 3 ? lo : lo + random() % (hi - lo + 1);
    std::string text = "[" + blanks(random);
    for (size_t i = 0; i < count; ++i) {
      text += (i ? "," + blanks(random) : "") + instance(i < prefix.size() ? prefix[i] : rest, root, random, depth + 1);
    }
    return text + blanks(random) + "]";
  }
  std::string text = "{" + blanks(random);
  bool first = true;
  const auto member = [&](const std::string& key, const Json& rule) {
    text += (first ? "" : "," + blanks(random)) + Json(key).dump() + blanks(random) + ":" + blanks(random) +
            instance(rule, root, random, depth + 1);
    first = false;
  };
  if (schema.contains("properties")) {
    const Json required = schema.value("required", Json::array());
    for (const auto& [key, rule] : schema["properties"].items()) {
      const bool needed = std::find(required.begin(), required.end(), key) != required.end();
      if (needed || (depth < 3 && random() % 2)) member(key, rule);
    }
  } else if (depth < 3) {
    for (int i = static_cast<int>(random() % 3); i > 0; --i) {
      member("k" + std::to_string(random() % 10), schema.value("additionalProperties", Json(true)));
    }
  }
  return text + blanks(random) + "}";
}

}  // namespace reference
}  // namespace serve
}  // namespace dschat
