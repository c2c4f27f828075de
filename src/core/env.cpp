#include "core/env.h"

#include <algorithm>
#include <cstdlib>

#include "dschat/core/error.h"

namespace dschat {
namespace core {

std::optional<std::string> read_string_from_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<int64_t> read_int_from_env(const char* name) {
  auto text = read_string_from_env(name);
  if (!text) return std::nullopt;
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(*text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DSCHAT_CHECK(used == text->size(), ConfigError, "environment variable ", name,
               ": expected an integer, got '", *text, "'");
  return value;
}

bool read_bool_from_env(const char* name, bool default_value) {
  auto text = read_string_from_env(name);
  if (!text) return default_value;
  std::string v = *text;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  DSCHAT_THROW(ConfigError, "environment variable ", name, ": expected a boolean (1/0, true/false), got '",
               *text, "'");
}

}  // namespace core
}  // namespace dschat
