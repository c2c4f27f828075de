#pragma once
// The only place the library reads environment variables. Malformed values throw ConfigError
// naming the variable.

#include <cstdint>
#include <optional>
#include <string>

namespace dschat {
namespace core {

std::optional<std::string> read_string_from_env(const char* name);  // unset or empty -> nullopt
std::optional<int64_t> read_int_from_env(const char* name);
bool read_bool_from_env(const char* name, bool default_value);  // 1/0, true/false, yes/no, on/off

}  // namespace core
}  // namespace dschat
