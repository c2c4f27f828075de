#include "core/json_object.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/strings.h"

namespace dschat {
namespace core {

JsonObject::JsonObject(const nlohmann::json& value, std::string where)
    : value_(&value), where_(std::move(where)) {
  DSCHAT_CHECK(value_->is_object(), ConfigError, where_, ": expected a JSON object, got ",
               value_->type_name());
}

bool JsonObject::has(const std::string& key) const {
  auto it = value_->find(key);
  return it != value_->end() && !it->is_null();
}

void JsonObject::type_error(const std::string& key, const char* expected) const {
  DSCHAT_THROW(ConfigError, at(key), " expects ", expected, ", got ", value_->at(key).type_name(),
               " ", value_->at(key).dump());
}

template <typename T>
std::optional<T> JsonObject::get_optional(const std::string& key) {
  read_.insert(key);
  if (!has(key)) return std::nullopt;
  const nlohmann::json& v = value_->at(key);
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) type_error(key, "a boolean");
    return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    int64_t value = 0;
    if (v.is_number_float()) {  // 1e3 and 2.0 are integers written as floats
      const double d = v.get<double>();
      // 2^63 bounds the cast (beyond it the conversion is undefined); a fraction is no integer.
      if (!(std::fabs(d) < 9.2e18) || d != std::trunc(d)) type_error(key, "an integer (within +-9.2e18)");
      value = static_cast<int64_t>(d);
    } else if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      DSCHAT_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), ConfigError, at(key),
                   " is out of range: ", v.dump());
      value = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      value = v.get<int64_t>();
    } else {
      type_error(key, "an integer");
    }
    if constexpr (std::is_unsigned_v<T>) {
      if (value < 0) type_error(key, "a non-negative integer");
      DSCHAT_CHECK(static_cast<uint64_t>(value) <= std::numeric_limits<T>::max(), ConfigError, at(key),
                   " is out of range: ", value);
    } else {
      // No silent wrap into a narrower type: 4294967299 is not zero_stage 3.
      DSCHAT_CHECK(value >= std::numeric_limits<T>::min() && value <= std::numeric_limits<T>::max(), ConfigError,
                   at(key), " is out of range: ", value);
    }
    return static_cast<T>(value);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) type_error(key, "a number");
    return v.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) type_error(key, "a string");
    return v.get<std::string>();
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    if (!v.is_array()) type_error(key, "an array of integers");
    std::vector<int64_t> out;
    for (const auto& item : v) {
      if (!item.is_number_integer()) type_error(key, "an array of integers");
      out.push_back(item.get<int64_t>());
    }
    return out;
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    if (!v.is_array()) type_error(key, "an array of strings");
    std::vector<std::string> out;
    for (const auto& item : v) {
      if (!item.is_string()) type_error(key, "an array of strings");
      out.push_back(item.get<std::string>());
    }
    return out;
  } else if constexpr (std::is_same_v<T, nlohmann::json>) {
    return v;
  } else {
    static_assert(sizeof(T) == 0, "unsupported JsonObject value type");
  }
}

template <typename T>
T JsonObject::require(const std::string& key) {
  auto value = get_optional<T>(key);
  DSCHAT_CHECK(value.has_value(), ConfigError, where_, ": missing required key '", key, "'");
  return *value;
}

std::optional<JsonObject> JsonObject::object(const std::string& key) {
  read_.insert(key);
  if (!has(key)) return std::nullopt;
  if (!value_->at(key).is_object()) type_error(key, "an object");
  return JsonObject(value_->at(key), where_ + ": " + key);
}

void JsonObject::accept(const std::vector<std::string>& keys) { read_.insert(keys.begin(), keys.end()); }

std::vector<std::string> JsonObject::unread_keys() const {
  std::vector<std::string> out;
  for (auto it = value_->begin(); it != value_->end(); ++it) {
    if (!read_.count(it.key())) out.push_back(it.key());
  }
  return out;
}

void JsonObject::finish(const std::vector<std::string>& known) const {
  auto unread = unread_keys();
  if (unread.empty()) return;
  std::vector<std::string> candidates(read_.begin(), read_.end());
  candidates.insert(candidates.end(), known.begin(), known.end());
  std::string suggestion = nearest_name(unread.front(), candidates);
  DSCHAT_THROW(ConfigError, where_, ": unknown key '", unread.front(), "'",
               suggestion.empty() ? std::string() : " (did you mean '" + suggestion + "'?)",
               unread.size() > 1 ? " (other unknown keys: " + join({unread.begin() + 1, unread.end()}) + ")"
                                 : std::string());
}

#define DSCHAT_JSON_INSTANTIATE(T)                                              \
  template std::optional<T> JsonObject::get_optional<T>(const std::string&); \
  template T JsonObject::require<T>(const std::string&);
DSCHAT_JSON_INSTANTIATE(bool)
DSCHAT_JSON_INSTANTIATE(int)
DSCHAT_JSON_INSTANTIATE(int64_t)
DSCHAT_JSON_INSTANTIATE(uint64_t)
DSCHAT_JSON_INSTANTIATE(double)
DSCHAT_JSON_INSTANTIATE(std::string)
DSCHAT_JSON_INSTANTIATE(std::vector<int64_t>)
DSCHAT_JSON_INSTANTIATE(std::vector<std::string>)
DSCHAT_JSON_INSTANTIATE(nlohmann::json)
#undef DSCHAT_JSON_INSTANTIATE

nlohmann::json parse_json_text(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    DSCHAT_THROW(ConfigError, where, ": invalid JSON at byte ", e.byte, ": ", e.what());
  } catch (const nlohmann::json::exception& e) {  // e.g. out_of_range 406: a number beyond double (1e999)
    DSCHAT_THROW(ConfigError, where, ": invalid JSON: ", e.what());
  }
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DSCHAT_CHECK(in.good(), IoError, path, ": cannot open file for reading");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parse_json_text(buffer.str(), path);
}

}  // namespace core
}  // namespace dschat
