#pragma once
// Private to json_schema.cpp: the keywords of strings (minLength, maxLength, pattern, format) and
// of numbers (minimum, maximum, exclusiveMinimum, exclusiveMaximum) compiled into a node, and
// the same keywords checked on an enum's values.

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "serve/json_schema.h"

namespace dschat {
namespace serve {
namespace detail {

extern const std::vector<std::string> kStringKeywords;   // minLength, maxLength, pattern, format
extern const std::vector<std::string> kNumberKeywords;   // minimum, maximum and their exclusive forms

/// A count keyword (minItems, maxLength, ...): an integer in [0, 65535], or `fallback` if absent.
int64_t count_keyword(const nlohmann::ordered_json& schema, const char* key, int64_t fallback,
                      const std::string& where);

/// Sets `leaf`'s min_length, max_length and pattern (added to `patterns`) from `schema`.
void compile_string_keywords(const nlohmann::ordered_json& schema, const std::string& where, JsonSchemaNode& leaf,
                             std::vector<JsonRegex>& patterns);

/// Sets `leaf`'s bounds (a kInteger's, with multipleOf, or a kNumber's) from `schema`.
void compile_number_keywords(const nlohmann::ordered_json& schema, const std::string& where, JsonSchemaNode& leaf);

/// Whether an enum's `value` keeps to `schema`'s string and number keywords (those of another
/// type than the value's do not apply to it, as JSON Schema has it).
bool keeps_scalar_keywords(const nlohmann::ordered_json& value, const nlohmann::ordered_json& schema,
                           const std::string& where);

}  // namespace detail
}  // namespace serve
}  // namespace dschat
