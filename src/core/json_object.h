#pragma once
// Typed, checked reading of one JSON object: the single place where configs become structs.
// Every key read is remembered; finish() rejects the keys nobody read and suggests the nearest
// known one, e.g.  "gen.json: unknown key 'max_new_token' (did you mean 'max_new_tokens'?)".
// Errors name the source (file), the key path and the offending value.

#include <nlohmann/json.hpp>

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dschat/core/error.h"
#include "dschat/core/json_file.h"

namespace dschat {
namespace core {

class JsonObject {
 public:
  /// `where` names the object in errors: "gen.json" or "ds_config.json: zero_optimization".
  JsonObject(const nlohmann::json& value, std::string where);

  bool has(const std::string& key) const;
  const std::string& where() const { return where_; }

  /// The value of `key` converted to T, or `fallback` when absent (or JSON null).
  template <typename T>
  T get(const std::string& key, const T& fallback) {
    auto value = get_optional<T>(key);
    return value ? *value : fallback;
  }
  template <typename T>
  std::optional<T> get_optional(const std::string& key);
  template <typename T>
  T require(const std::string& key);

  /// A nested object (must be a JSON object when present).
  std::optional<JsonObject> object(const std::string& key);

  /// Marks keys as accepted without being used (for files written by other tools).
  void accept(const std::vector<std::string>& keys);

  /// Keys present but never read or accepted.
  std::vector<std::string> unread_keys() const;

  /// Throws ConfigError for the first unread key, with the nearest known key suggested.
  /// `known` adds names that are valid but were absent from this file, for better suggestions.
  void finish(const std::vector<std::string>& known = {}) const;

  /// The location string used in messages for `key`.
  std::string at(const std::string& key) const { return where_ + ": key '" + key + "'"; }

 private:
  [[noreturn]] void type_error(const std::string& key, const char* expected) const;

  const nlohmann::json* value_;  // not owned: the parsed document outlives its readers
  std::string where_;
  std::set<std::string> read_;
};


/// Range check helper: throws ConfigError "<where>: key 'k' must be in [lo, hi], got v".
template <typename T>
T check_range(const JsonObject& object, const std::string& key, T value, T lo, T hi) {
  DSCHAT_CHECK(value >= lo && value <= hi, ConfigError, object.at(key), " must be in [", lo, ", ", hi,
               "], got ", value);
  return value;
}

}  // namespace core
}  // namespace dschat
