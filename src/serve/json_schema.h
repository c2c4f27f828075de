#pragma once
// A JSON Schema compiled for schema-guided decoding (`dschat serve`'s response_format json_schema
// and forced tool calls): a graph of nodes a byte machine (json_machine.h) walks while the model
// writes. Every text the machine accepts validates against the schema; the machine may accept
// fewer texts than the schema allows, as OpenAI's structured outputs and xgrammar's strict mode
// do: an object's keys come in the schema's order (an optional one may be left out), and an
// object with declared properties takes no others.
//
// Supported: type (one or a list), properties, required, additionalProperties (for objects
// without properties), items, prefixItems (or a list under items, and additionalItems),
// minItems, maxItems, enum, const, anyOf / oneOf (at most 64
// branches, nested ones counted; a text that would need more at once is refused), $ref to "#",
// "#/$defs/..." or "#/definitions/..." (recursion included), minLength, maxLength, pattern
// (json_regex.h), format (date, time, date-time, uuid, email, ipv4, uri), minimum / maximum /
// exclusiveMinimum / exclusiveMaximum on integers and numbers (bounds of at most 15 significant
// digits), multipleOf on integers (these on any enum's values too), and the annotations (title,
// description, default, examples, ...). Any other keyword (uniqueItems, another format, ...) is
// refused by name: the constraint would be silently dropped otherwise.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "serve/json_decimal.h"
#include "serve/json_regex.h"

namespace dschat {
namespace serve {

struct JsonSchemaNode {
  enum class Kind : uint8_t { kAny, kObject, kArray, kString, kNumber, kInteger, kBoolean, kNull, kEnum, kAnyOf };
  struct Property {
    std::string key_text;  // the key as written, quotes included: "\"city\""
    int32_t node = -1;
    bool required = false;
  };
  Kind kind = Kind::kAny;
  // kObject. With properties: they come in this order, the required ones all present, no others.
  // Without: any keys, each value of `additional` (-1: none, only {}).
  std::vector<Property> properties;
  std::vector<uint8_t> required_from;  // [properties + 1]: 1 when a required property is at or after i
  int32_t additional = -1;
  // kArray: item i of prefix_items[i] (a tuple's), the rest of `items`, between min_items and
  // max_items of them (-1: no bound).
  std::vector<int32_t> prefix_items;
  int32_t items = -1;
  int64_t min_items = 0;
  int64_t max_items = -1;
  // kString: between min_length and max_length code points (-1: no bound), matched by the
  // schema's patterns[pattern] (-1: none).
  int64_t min_length = 0;
  int64_t max_length = -1;
  int32_t pattern = -1;
  // kInteger: within [minimum, maximum] and a multiple of multiple_of (0: any) when bounded.
  // kNumber: from number_from to number_to (json_decimal.h) when bounded.
  bool bounded = false;
  int64_t minimum = 0;
  int64_t maximum = 0;
  int64_t multiple_of = 0;
  JsonDecimalEnd number_from, number_to;
  // kEnum: the allowed values as compact JSON texts, sorted (a prefix's candidates are a range).
  std::vector<std::string> values;
  // kAnyOf: its branches, none of them kAnyOf (nested ones are flattened).
  std::vector<int32_t> branches;
};

struct JsonSchema {
  std::vector<JsonSchemaNode> nodes;
  std::vector<JsonRegex> patterns;  // the strings' patterns and formats
  int32_t root = -1;
};

/// Compiles `schema`; a schema it cannot follow throws ApiError(400) naming the key path under
/// `where` ("response_format.json_schema.schema.properties.city.pattern").
std::shared_ptr<const JsonSchema> compile_json_schema(const nlohmann::ordered_json& schema, const std::string& where);

}  // namespace serve
}  // namespace dschat
