#include "serve/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "serve/json_schema_scalars.h"
#include "serve/openai_protocol.h"

namespace dschat {
namespace serve {
namespace {

using SchemaJson = nlohmann::ordered_json;
using Kind = JsonSchemaNode::Kind;

// Keywords that constrain nothing: OpenAPI's discriminator names the property that tells a oneOf's
// branches apart (Pydantic's discriminated unions), which their consts already enforce.
const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id",
                                            "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                            "definitions", "discriminator"};
const std::set<std::string> kStructural = {"type", "properties", "required", "additionalProperties", "items",
                                           "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "$ref",
                                           "nullable", "prefixItems", "additionalItems", "minLength", "maxLength",
                                           "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                                           "exclusiveMaximum", "multipleOf", "allOf"};
const std::set<std::string> kObjectKeywords = {"properties", "required", "additionalProperties"};
const std::set<std::string> kArrayKeywords = {"items", "prefixItems", "additionalItems", "minItems", "maxItems"};

bool any_of_keys(const SchemaJson& schema, const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    if (schema.contains(key)) return true;
  }
  return false;
}

// The byte machine follows at most this many branches at once (JsonMachine::kMaxPaths).
constexpr size_t kMaxBranches = 64;

const std::map<std::string, Kind> kTypes = {{"object", Kind::kObject},   {"array", Kind::kArray},
                                            {"string", Kind::kString},   {"number", Kind::kNumber},
                                            {"integer", Kind::kInteger}, {"boolean", Kind::kBoolean},
                                            {"null", Kind::kNull}};

// Whether `value` is of JSON Schema type `kind` (an integer is also a number).
bool of_type(const SchemaJson& value, Kind kind) {
  switch (kind) {
    case Kind::kObject: return value.is_object();
    case Kind::kArray: return value.is_array();
    case Kind::kString: return value.is_string();
    case Kind::kNumber: return value.is_number();
    case Kind::kInteger:
      return value.is_number_integer() ||
             (value.is_number_float() && std::isfinite(value.get<double>()) &&
              value.get<double>() == std::floor(value.get<double>()));
    case Kind::kBoolean: return value.is_boolean();
    case Kind::kNull: return value.is_null();
    default: return true;
  }
}

class Compiler {
 public:
  Compiler(const SchemaJson& root, std::string where) : root_(root), where_(std::move(where)) {}

  std::shared_ptr<const JsonSchema> run() {
    auto schema = std::make_shared<JsonSchema>();
    schema_ = schema.get();
    schema->root = node(root_, where_);
    flatten_any_of();
    return schema;
  }

 private:
  int32_t add(JsonSchemaNode node) {
    schema_->nodes.push_back(std::move(node));
    return static_cast<int32_t>(schema_->nodes.size() - 1);
  }

  int32_t any_node() {
    if (any_ < 0) any_ = add(JsonSchemaNode{});
    return any_;
  }

  int32_t node(const SchemaJson& schema, const std::string& where) {
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) throw bad_key(where, "is false: it allows no value at all");
      return any_node();
    }
    if (!schema.is_object()) throw bad_key(where, "must be a JSON Schema (an object or a boolean)");
    for (const auto& [key, value] : schema.items()) {
      if (kAnnotations.count(key) == 0 && kStructural.count(key) == 0) {
        throw bad_key(where + "." + key, "is not supported by dschat serve's schema-guided decoding (it follows "
                                            "type, properties, required, additionalProperties, items, prefixItems, "
                                            "additionalItems, minItems, "
                                            "maxItems, enum, const, anyOf, oneOf, $ref, nullable, minLength, "
                                            "maxLength, pattern, format, minimum, maximum, exclusiveMinimum, "
                                            "exclusiveMaximum, multipleOf and allOf of one schema)");
      }
    }
    if (schema.value("nullable", false)) {
      SchemaJson rest = schema;
      rest.erase("nullable");
      return any_of({rest, SchemaJson{{"type", "null"}}}, where);
    }
    if (schema.contains("allOf")) return all_of(schema, where);
    if (schema.contains("$ref")) return reference(schema, where);
    for (const char* key : {"anyOf", "oneOf"}) {
      if (schema.contains(key)) return any_of_with_siblings(schema, key, where);
    }
    if (schema.contains("type") && schema["type"].is_array()) return type_list(schema, where);
    if (schema.contains("enum") || schema.contains("const")) return enumeration(schema, where);
    Kind kind = Kind::kAny;
    if (schema.contains("type")) {
      const SchemaJson& type = schema["type"];
      if (!type.is_string() || kTypes.count(type.get<std::string>()) == 0) {
        throw bad_key(where + ".type", "must be one of object, array, string, number, integer, boolean, null "
                                          "(or a list of them)");
      }
      kind = kTypes.at(type.get<std::string>());
    } else if (schema.contains("properties") || schema.contains("required") ||
               schema.contains("additionalProperties")) {
      kind = Kind::kObject;
    } else if (any_of_keys(schema, {"items", "prefixItems", "minItems", "maxItems"})) {
      kind = Kind::kArray;
    } else if (any_of_keys(schema, detail::kStringKeywords)) {
      kind = Kind::kString;
    } else if (any_of_keys(schema, detail::kNumberKeywords)) {
      kind = Kind::kNumber;
    }
    check_keywords_fit(schema, kind, where);
    if (kind == Kind::kObject) return object(schema, where);
    if (kind == Kind::kArray) return array(schema, where);
    JsonSchemaNode leaf;
    leaf.kind = kind;
    if (kind == Kind::kString) detail::compile_string_keywords(schema, where, leaf, schema_->patterns);
    if (kind == Kind::kInteger || kind == Kind::kNumber) detail::compile_number_keywords(schema, where, leaf);
    return kind == Kind::kAny ? any_node() : add(std::move(leaf));
  }

  // A keyword of another type than the node's is a mistake in a schema of one type (lists of
  // types give each branch its own keywords: type_list).
  static void check_keywords_fit(const SchemaJson& schema, Kind kind, const std::string& where) {
    for (const auto& [key, value] : schema.items()) {
      const char* only = kObjectKeywords.count(key) && kind != Kind::kObject  ? "objects"
                         : kArrayKeywords.count(key) && kind != Kind::kArray  ? "arrays"
                         : keyword_of(detail::kStringKeywords, key) && kind != Kind::kString ? "strings"
                                                                                              : nullptr;
      if (only) throw bad_key(where + "." + key, std::string("is only for ") + only);
      if (keyword_of(detail::kNumberKeywords, key) && kind != Kind::kInteger && kind != Kind::kNumber) {
        throw bad_key(where + "." + key, "is only for numbers");
      }
      if (key == "multipleOf" && kind != Kind::kInteger) {
        throw bad_key(where + "." + key, "is followed on integers only (\"type\": \"integer\")");
      }
    }
  }

  static bool keyword_of(const std::vector<std::string>& keywords, const std::string& key) {
    return std::find(keywords.begin(), keywords.end(), key) != keywords.end();
  }

  // The keywords of a list of types that apply to `type` (JSON Schema ignores the others there).
  static SchemaJson keywords_for(const SchemaJson& schema, const std::string& type) {
    SchemaJson branch = schema;
    branch["type"] = type;
    for (const auto& [key, value] : schema.items()) {
      const bool applies = kObjectKeywords.count(key) ? type == "object"
                           : kArrayKeywords.count(key) ? type == "array"
                           : keyword_of(detail::kStringKeywords, key) ? type == "string"
                           : keyword_of(detail::kNumberKeywords, key) || key == "multipleOf"
                               ? type == "integer" || type == "number"
                                                                      : true;
      if (!applies) branch.erase(key);
    }
    return branch;
  }

  int32_t object(const SchemaJson& schema, const std::string& where) {
    JsonSchemaNode object;
    object.kind = Kind::kObject;
    const int32_t index = add(JsonSchemaNode{});  // reserved: a $ref inside may come back here
    std::set<std::string> required;
    if (schema.contains("required")) {
      const SchemaJson& names = schema["required"];
      if (!names.is_array()) throw bad_key(where + ".required", "must be a list of property names");
      for (const SchemaJson& name : names) {
        if (!name.is_string()) throw bad_key(where + ".required", "must be a list of property names");
        required.insert(name.get<std::string>());
      }
    }
    if (schema.contains("properties")) {
      const SchemaJson& properties = schema["properties"];
      if (!properties.is_object()) throw bad_key(where + ".properties", "must be an object of schemas");
      for (const auto& [key, value] : properties.items()) {
        JsonSchemaNode::Property property;
        property.key_text = SchemaJson(key).dump();
        property.required = required.count(key) > 0;
        property.node = node(value, where + ".properties." + key);
        object.properties.push_back(std::move(property));
      }
      for (const std::string& name : required) {
        if (!properties.contains(name)) {
          throw bad_key(where + ".required", "names '" + name + "', which is not in properties");
        }
      }
    } else {
      if (!required.empty()) throw bad_key(where + ".required", "names properties, but the object declares none");
      const SchemaJson additional = schema.value("additionalProperties", SchemaJson(true));
      if (!(additional.is_boolean() && !additional.get<bool>())) {
        object.additional = node(additional, where + ".additionalProperties");
      }
    }
    object.required_from.assign(object.properties.size() + 1, 0);
    for (size_t i = object.properties.size(); i-- > 0;) {
      object.required_from[i] = object.required_from[i + 1] || object.properties[i].required;
    }
    schema_->nodes[static_cast<size_t>(index)] = std::move(object);
    return index;
  }

  int32_t array(const SchemaJson& schema, const std::string& where) {
    JsonSchemaNode array;
    array.kind = Kind::kArray;
    const int32_t index = add(JsonSchemaNode{});
    array.min_items = detail::count_keyword(schema, "minItems", 0, where);
    array.max_items = detail::count_keyword(schema, "maxItems", -1, where);
    // Tuples: prefixItems (2020-12) then items for the rest, or a list under items (drafts 4 to
    // 2019-09) then additionalItems for the rest. A rest of false allows no more items.
    const bool listed = schema.contains("items") && schema["items"].is_array();
    const char* prefix_key = listed ? "items" : "prefixItems";
    const char* rest_key = listed ? "additionalItems" : "items";
    if (schema.contains(prefix_key)) {
      const SchemaJson& prefix = schema[prefix_key];
      if (!prefix.is_array()) throw bad_key(where + "." + prefix_key, "must be a list of schemas");
      for (size_t i = 0; i < prefix.size(); ++i) {
        array.prefix_items.push_back(node(prefix[i], where + "." + prefix_key + "[" + std::to_string(i) + "]"));
      }
    } else if (schema.contains("additionalItems")) {
      throw bad_key(where + ".additionalItems", "is only for a list under items");
    }
    const SchemaJson rest = schema.value(rest_key, SchemaJson(true));
    if (rest.is_boolean() && !rest.get<bool>()) {
      const auto size = static_cast<int64_t>(array.prefix_items.size());
      array.max_items = array.max_items < 0 ? size : std::min(array.max_items, size);
      array.items = any_node();  // never reached: max_items stops at the prefix
    } else {
      array.items = node(rest, where + "." + rest_key);
    }
    if (array.max_items >= 0 && array.max_items < array.min_items) {
      throw bad_key(where + (schema.contains("maxItems") ? ".maxItems" : "." + std::string(rest_key)),
                       "leaves fewer items than minItems");
    }
    schema_->nodes[static_cast<size_t>(index)] = std::move(array);
    return index;
  }

  int32_t enumeration(const SchemaJson& schema, const std::string& where) {
    const char* key = schema.contains("const") ? "const" : "enum";
    const SchemaJson values = schema.contains("const") ? SchemaJson::array({schema["const"]}) : schema["enum"];
    if (!values.is_array() || values.empty()) throw bad_key(where + ".enum", "must be a non-empty list of values");
    std::optional<Kind> type;
    if (schema.contains("type")) {
      if (!schema["type"].is_string() || kTypes.count(schema["type"].get<std::string>()) == 0) {
        throw bad_key(where + ".type", "must be a JSON Schema type");
      }
      type = kTypes.at(schema["type"].get<std::string>());
    }
    JsonSchemaNode node;
    node.kind = Kind::kEnum;
    for (const SchemaJson& value : values) {
      if ((!type || of_type(value, *type)) && detail::keeps_scalar_keywords(value, schema, where)) {
        node.values.push_back(value.dump());
      }
    }
    if (node.values.empty()) throw bad_key(where + "." + key, "holds no value of the schema's type and keywords");
    std::sort(node.values.begin(), node.values.end());
    node.values.erase(std::unique(node.values.begin(), node.values.end()), node.values.end());
    return add(std::move(node));
  }

  int32_t any_of(const std::vector<SchemaJson>& branches, const std::string& where) {
    if (branches.size() > kMaxBranches) {
      throw bad_key(where, "has " + std::to_string(branches.size()) + " branches; at most " +
                                  std::to_string(kMaxBranches) + " are followed");
    }
    const int32_t index = add(JsonSchemaNode{});
    JsonSchemaNode node;
    node.kind = Kind::kAnyOf;
    for (size_t i = 0; i < branches.size(); ++i) {
      node.branches.push_back(this->node(branches[i], where + "[" + std::to_string(i) + "]"));
    }
    schema_->nodes[static_cast<size_t>(index)] = std::move(node);
    return index;
  }

  // {"type": "object", "anyOf": [...]}: each branch takes the keywords beside anyOf as well.
  int32_t any_of_with_siblings(const SchemaJson& schema, const char* key, const std::string& where) {
    const SchemaJson& list = schema[key];
    if (!list.is_array() || list.empty()) throw bad_key(where + "." + key, "must be a non-empty list of schemas");
    std::vector<SchemaJson> branches;
    for (size_t i = 0; i < list.size(); ++i) branches.push_back(with_siblings(schema, key, i, where));
    return any_of(branches, where + "." + key);
  }

  // Branch i of schema[key] with the keywords beside `key` added.
  static SchemaJson with_siblings(const SchemaJson& schema, const char* key, size_t i, const std::string& where) {
    SchemaJson branch = schema[key][i];
    if (!branch.is_object()) return branch;
    for (const auto& [sibling, value] : schema.items()) {
      if (sibling == key || kAnnotations.count(sibling)) continue;
      if (branch.contains(sibling) && branch[sibling] != value) {
        throw bad_key(where + "." + key + "[" + std::to_string(i) + "]." + sibling,
                         "differs from the '" + sibling + "' beside " + key + " (intersections are not supported)");
      }
      branch[sibling] = value;
    }
    return branch;
  }

  // {"allOf": [X], ...}: X with the keywords beside it (Pydantic v1 wraps a described $ref so).
  int32_t all_of(const SchemaJson& schema, const std::string& where) {
    const SchemaJson& list = schema["allOf"];
    if (!list.is_array() || list.size() != 1) {
      throw bad_key(where + ".allOf", "is followed with one schema only (intersections are not supported)");
    }
    return node(with_siblings(schema, "allOf", 0, where), where + ".allOf[0]");
  }

  int32_t type_list(const SchemaJson& schema, const std::string& where) {
    std::vector<SchemaJson> branches;
    for (const SchemaJson& type : schema["type"]) {
      if (!type.is_string()) throw bad_key(where + ".type", "must list type names");
      branches.push_back(keywords_for(schema, type.get<std::string>()));
    }
    if (branches.empty()) throw bad_key(where + ".type", "must not be an empty list");
    return any_of(branches, where + ".type");
  }

  int32_t reference(const SchemaJson& schema, const std::string& where) {
    const SchemaJson& ref = schema["$ref"];
    if (schema.size() > 1) {
      for (const auto& [key, value] : schema.items()) {
        if (key != "$ref" && kAnnotations.count(key) == 0) {
          throw bad_key(where + "." + key, "beside $ref is not supported");
        }
      }
    }
    const std::string text = ref.is_string() ? ref.get<std::string>() : "";
    if (text.empty() || text[0] != '#') {
      throw bad_key(where + ".$ref", "must point into this schema (\"#\", \"#/$defs/Name\")");
    }
    if (auto found = refs_.find(text); found != refs_.end()) return found->second;
    const std::string pointer = text.substr(1);
    SchemaJson::json_pointer path;
    try {
      path = SchemaJson::json_pointer(pointer);
    } catch (const SchemaJson::exception&) {
      throw bad_key(where + ".$ref", "is not a JSON pointer: " + text);
    }
    if (!root_.contains(path)) throw bad_key(where + ".$ref", "points at nothing: " + text);
    // The reference is an anyOf of one branch whose index is reserved first, so a recursive
    // reference inside its target finds it.
    const int32_t index = add(JsonSchemaNode{});
    refs_[text] = index;
    JsonSchemaNode link;
    link.kind = Kind::kAnyOf;
    link.branches = {node(root_.at(path), where + ".$ref(" + text + ")")};
    schema_->nodes[static_cast<size_t>(index)] = std::move(link);
    return index;
  }

  // Every anyOf's branches become the non-anyOf nodes they reach (so the machine splits once per
  // value); an anyOf that reaches itself through anyOf branches alone is refused.
  void flatten_any_of() {
    std::vector<JsonSchemaNode>& nodes = schema_->nodes;
    std::vector<std::vector<int32_t>> leaves(nodes.size());
    std::vector<uint8_t> state(nodes.size(), 0);  // 0 new, 1 on the path, 2 done
    std::function<void(int32_t)> visit = [&](int32_t at) {
      if (state[at] == 2) return;
      if (state[at] == 1) throw bad_key(where_, "has an anyOf or $ref that refers to itself with no value between");
      state[at] = 1;
      for (int32_t branch : nodes[at].branches) {
        if (nodes[branch].kind != Kind::kAnyOf) {
          leaves[at].push_back(branch);
          continue;
        }
        visit(branch);
        leaves[at].insert(leaves[at].end(), leaves[branch].begin(), leaves[branch].end());
      }
      state[at] = 2;
    };
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].kind == Kind::kAnyOf) visit(static_cast<int32_t>(i));
    }
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].kind != Kind::kAnyOf) continue;
      std::vector<int32_t>& list = leaves[i];
      std::sort(list.begin(), list.end());
      list.erase(std::unique(list.begin(), list.end()), list.end());
      if (list.size() > kMaxBranches) {
        throw bad_key(where_, "has an anyOf of " + std::to_string(list.size()) + " branches with the ones nested "
                                 "in it; at most " + std::to_string(kMaxBranches) + " are followed");
      }
      nodes[i].branches = std::move(list);
    }
  }

  const SchemaJson& root_;
  std::string where_;
  JsonSchema* schema_ = nullptr;
  int32_t any_ = -1;
  std::map<std::string, int32_t> refs_;
};

}  // namespace

std::shared_ptr<const JsonSchema> compile_json_schema(const nlohmann::ordered_json& schema, const std::string& where) {
  return Compiler(schema, where).run();
}

}  // namespace serve
}  // namespace dschat
