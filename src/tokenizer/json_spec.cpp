#include "tokenizer/json_spec.h"

#include "dschat/core/error.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {

JsonSpec::JsonSpec(const nlohmann::json& value, std::string where) : value_(value), where_(std::move(where)) {
  DSCHAT_CHECK(value_.is_object(), FormatError, where_, ": expected a JSON object, got ", value_.type_name());
}

const nlohmann::json& JsonSpec::at(const char* key, bool (nlohmann::json::*check)() const noexcept,
                                   const char* expected) const {
  auto it = value_.find(key);
  DSCHAT_CHECK(it != value_.end(), FormatError, where_, ": missing key '", key, "'");
  DSCHAT_CHECK(((*it).*check)(), FormatError, where_, ": key '", key, "' expects ", expected, ", got ",
               it->type_name());
  return *it;
}

std::string JsonSpec::type() const { return string("type"); }

bool JsonSpec::has(const char* key) const {
  auto it = value_.find(key);
  return it != value_.end() && !it->is_null();
}

std::string JsonSpec::string(const char* key) const {
  return at(key, &nlohmann::json::is_string, "a string").get<std::string>();
}

std::string JsonSpec::string_or(const char* key, const std::string& fallback) const {
  return has(key) ? string(key) : fallback;
}

bool JsonSpec::boolean_or(const char* key, bool fallback) const {
  return has(key) ? at(key, &nlohmann::json::is_boolean, "a boolean").get<bool>() : fallback;
}

int64_t JsonSpec::integer(const char* key) const {
  return at(key, &nlohmann::json::is_number_integer, "an integer").get<int64_t>();
}

double JsonSpec::number_or(const char* key, double fallback) const {
  return has(key) ? at(key, &nlohmann::json::is_number, "a number").get<double>() : fallback;
}

const nlohmann::json& JsonSpec::array(const char* key) const {
  return at(key, &nlohmann::json::is_array, "an array");
}

const nlohmann::json& JsonSpec::object(const char* key) const {
  return at(key, &nlohmann::json::is_object, "an object");
}

char32_t JsonSpec::character(const char* key) const {
  std::string s = string(key);
  DSCHAT_CHECK(!s.empty() && find_invalid_utf8(s) == std::string::npos && count_code_points(s) == 1, FormatError,
               where_, ": key '", key, "' expects a single character, got '", s, "'");
  size_t pos = 0;
  return next_code_point(s, pos);
}

std::vector<JsonSpec> JsonSpec::children(const char* key) const {
  const nlohmann::json& items = array(key);
  std::vector<JsonSpec> out;
  for (size_t i = 0; i < items.size(); ++i) {
    out.emplace_back(items[i], where_ + "." + key + "[" + std::to_string(i) + "]");
  }
  return out;
}

void JsonSpec::unsupported(const std::string& what, const std::string& supported) const {
  DSCHAT_THROW(Unsupported, where_, ": unsupported ", what, " (dschat supports ", supported, ")");
}

}  // namespace tokenizer
}  // namespace dschat
