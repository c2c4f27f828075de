// Schema-guided decoding (serve/json_schema.h, serve/json_machine.h) against a validator written
// here as JSON Schema defines validation (a recursive check of the parsed value, no byte machine):
// texts generated from each schema are accepted prefix by prefix; random walks over the bytes the
// machine allows never reach a dead end and end only in texts the validator accepts; texts with a
// byte changed are accepted only if they validate. Compile errors name their key path.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "dschat/tokenizer/tokenizer.h"
#include "serve/json_machine.h"
#include "serve/json_mode.h"
#include "serve/openai_protocol.h"
#include "json_text_mutation.h"
#include "test_util.h"

namespace dschat {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

// ---- the reference: JSON Schema's validation of a parsed value
bool validates(const Json& value, const Json& schema, const Json& root);

bool of_type(const Json& value, const std::string& type) {
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

bool validates(const Json& value, const Json& schema, const Json& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    return validates(value, root.at(Json::json_pointer(schema["$ref"].get<std::string>().substr(1))), root);
  }
  if (schema.value("nullable", false) && value.is_null()) return true;
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
    for (const Json& item : value) {
      if (!validates(item, schema.value("items", Json(true)), root)) return false;
    }
  }
  return true;
}

bool text_validates(const std::string& text, const Json& schema) {
  const Json value = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return !value.is_discarded() && validates(value, schema, schema);
}

// ---- the schemas: objects with optional keys, enums of every kind, unions told apart late,
// recursion, maps, top-level scalars, forced tool calls' shape
std::vector<Json> schemas() {
  return {
      Json::parse(R"({"type": "object", "properties": {
          "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
          "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
          "role": {"enum": ["admin", "user", 1, 12, 1.5, null, true, {"a": [1]}]},
          "score": {"type": ["number", "null"]}},
        "required": ["name", "age"], "additionalProperties": false})"),
      Json::parse(R"({"anyOf": [
          {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
           "required": ["kind", "r"]},
          {"type": "object", "properties": {"kind": {"const": "rect"}, "w": {"type": "number"},
           "h": {"type": "number"}}, "required": ["kind", "w", "h"]},
          {"type": ["string", "null"]}]})"),
      Json::parse(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["v"]}},
        "$ref": "#/$defs/node"})"),
      Json::parse(R"({"type": "object", "additionalProperties": {"type": "number"}})"),
      Json::parse(R"({"enum": [1, 12, 1.5, "x"]})"),
      Json::parse(R"({"type": "integer"})"),
      Json::parse(R"({"type": "boolean", "nullable": true})"),
      Json::parse(R"({"type": "array", "minItems": 1, "items": {"anyOf": [
          {"type": "object", "properties": {"name": {"const": "get_weather"}, "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}},
           "required": ["name", "parameters"]},
          {"type": "object", "properties": {"name": {"const": "get_time"}, "parameters": {"type": "object",
            "properties": {}}}, "required": ["name", "parameters"]}]}})"),
      Json::parse(R"({"type": "object"})"),
  };
}

std::string blanks(std::mt19937& random) {
  static const char* const kBlanks[] = {"", "", "", " ", "\n", "  ", "\t", "\r\n"};
  return kBlanks[random() % 8];
}

// A value of `schema` as the machine reads them: keys in the schema's order, optional ones left
// out at random, random blanks between tokens.
std::string instance(const Json& schema, const Json& root, std::mt19937& random, int depth) {
  if (schema.is_boolean() || schema.empty()) {  // any value
    static const char* const kAny[] = {"0", "-2.5e3", "\"s\"", "true", "null", "[1, {\"k\": []}]", "{}"};
    return kAny[random() % 7];
  }
  if (schema.contains("$ref")) {
    return instance(root.at(Json::json_pointer(schema["$ref"].get<std::string>().substr(1))), root, random, depth);
  }
  if (schema.value("nullable", false) && random() % 3 == 0) return "null";
  if (schema.contains("anyOf")) {
    return instance(schema["anyOf"][random() % schema["anyOf"].size()], root, random, depth);
  }
  if (schema.contains("const")) return schema["const"].dump();
  if (schema.contains("enum")) return schema["enum"][random() % schema["enum"].size()].dump();
  std::string type = "object";
  if (schema.contains("type")) {
    const Json& types = schema["type"];
    type = types.is_array() ? types[random() % types.size()].get<std::string>() : types.get<std::string>();
  }
  static const char* const kStrings[] = {"\"\"", "\"Paris\"", "\"a \\\"q\\\" \\u00e9 \\n\"", "\"h\xc3\xa9llo\""};
  static const char* const kNumbers[] = {"0", "-0", "3.25", "-4.5e10", "6E-2", "7e+3", "12"};
  if (type == "string") return kStrings[random() % 4];
  if (type == "integer") return std::to_string(static_cast<int>(random() % 2001) - 1000);
  if (type == "number") return kNumbers[random() % 7];
  if (type == "boolean") return random() % 2 ? "true" : "false";
  if (type == "null") return "null";
  if (type == "array") {
    const size_t lo = schema.value("minItems", 0u), hi = std::min<size_t>(schema.value("maxItems", 4u), 4);
    const size_t count = depth > 3 ? lo : lo + random() % (hi - lo + 1);
    std::string text = "[" + blanks(random);
    for (size_t i = 0; i < count; ++i) {
      text += (i ? "," + blanks(random) : "") + instance(schema.value("items", Json(true)), root, random, depth + 1);
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

std::string quoted(const std::string& text) {
  return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
}

TEST(JsonSchemaMachine, AcceptsTheSchemasTextsPrefixByPrefixAndNoTextThatFailsValidation) {
  std::mt19937 random(5);
  const std::string alphabet = "{}[]\",:0123456789.-+eEtrufalsnxcPr \\";
  for (const Json& schema : schemas()) {
    const auto compiled = compile_json_schema(schema, "schema");
    int mutated_accepted = 0, mutated_refused = 0;
    for (int trial = 0; trial < 400; ++trial) {
      const std::string text = instance(schema, schema, random, 0);
      ASSERT_TRUE(text_validates(text, schema)) << schema.dump() << " generated " << text;
      JsonMachine machine(*compiled);
      for (size_t i = 0; i < text.size(); ++i) {
        ASSERT_TRUE(machine.feed(text[i])) << schema.dump() << ": " << quoted(text) << " refused at " << i;
        // Whole only where the text so far is a valid value ("1" of "12" is).
        if (machine.complete()) ASSERT_TRUE(text_validates(text.substr(0, i + 1), schema)) << quoted(text) << " " << i;
      }
      ASSERT_TRUE(machine.complete()) << schema.dump() << ": " << quoted(text);
      for (int m = 0; m < 3; ++m) {  // one byte replaced, inserted or deleted
        const std::string mutated = one_byte_changed(text, alphabet, random);
        // A change that split a UTF-8 character is not compared (json_text_mutation.h).
        if (!valid_utf8(mutated)) continue;
        JsonMachine probe(*compiled);
        if (probe.feed(mutated) && probe.complete()) {
          EXPECT_TRUE(text_validates(mutated, schema)) << schema.dump() << ": " << quoted(mutated) << " from "
                                                       << quoted(text);
          ++mutated_accepted;
        } else {
          ++mutated_refused;
        }
      }
    }
    EXPECT_GT(mutated_accepted, 10) << schema.dump();  // both sides were exercised
    EXPECT_GT(mutated_refused, 200) << schema.dump();
  }
}

TEST(JsonSchemaMachine, RandomWalksNeverDeadEndAndEndOnlyInValidTexts) {
  // From any text the machine took, some byte (or the end) must be allowed: a model under the
  // constraint always has a token. Bytes drawn among the allowed ones, structure favoured.
  const std::string alphabet = "{}[]\",:,,]}\"0123456789.-eEtrufalsnxckindcirclerectnamegetweatherparamsv \n";
  std::mt19937 random(9);
  for (const Json& schema : schemas()) {
    const auto compiled = compile_json_schema(schema, "schema");
    int ended = 0;
    for (int walk = 0; walk < 300; ++walk) {
      JsonMachine machine(*compiled);
      std::string text;
      for (int step = 0; step < 400; ++step) {
        if (machine.complete() && random() % 4 == 0) break;
        std::vector<char> allowed;
        for (int byte = 1; byte < 256; ++byte) {
          JsonMachine probe = machine;
          if (probe.feed(static_cast<char>(byte))) allowed.push_back(static_cast<char>(byte));
        }
        ASSERT_TRUE(!allowed.empty() || machine.complete()) << schema.dump() << ": dead end after " << quoted(text);
        if (allowed.empty()) break;
        std::vector<char> favoured;
        for (char c : allowed) {
          if (alphabet.find(c) != std::string::npos) favoured.push_back(c);
        }
        const std::vector<char>& pool = favoured.empty() ? allowed : favoured;
        const char c = pool[random() % pool.size()];
        ASSERT_TRUE(machine.feed(c));
        text += c;
      }
      if (!machine.complete()) continue;
      ++ended;
      EXPECT_TRUE(text_validates(text, schema)) << schema.dump() << ": " << quoted(text);
    }
    EXPECT_GT(ended, 30) << schema.dump();
  }
}

// tool_choice "required" over many tools: every branch begins alike ({"name": "tool_), so the
// machine follows all 40 side by side until the name tells them apart; no walk dead-ends.
TEST(JsonSchemaMachine, FortyBranchesThatBeginAlikeAreFollowedTogether) {
  Json branches = Json::array();
  for (int i = 0; i < 40; ++i) {
    const Json parameters = {{"type", "object"}, {"properties", {{"x" + std::to_string(i), {{"type", "integer"}}}}}};
    const Json properties = {{"name", {{"const", "tool_" + std::to_string(i)}}}, {"parameters", parameters}};
    branches.push_back({{"type", "object"}, {"properties", properties}, {"required", {"name", "parameters"}}});
  }
  const Json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", branches}}}};
  const auto compiled = compile_json_schema(schema, "s");
  JsonMachine machine(*compiled);
  EXPECT_TRUE(machine.feed(R"([{"name": "tool_39", "parameters": {"x39": 7}}, {"name": "tool_3", "parameters": {}}])"));
  EXPECT_TRUE(machine.complete());
  JsonMachine wrong(*compiled);
  EXPECT_FALSE(wrong.feed(R"([{"name": "tool_39", "parameters": {"x3": 7}})"));
  std::mt19937 random(4);
  for (int walk = 0; walk < 40; ++walk) {
    JsonMachine walker(*compiled);
    std::string text;
    for (int step = 0; step < 200 && !(walker.complete() && random() % 4 == 0); ++step) {
      std::vector<char> allowed;
      for (int byte = 1; byte < 128; ++byte) {
        JsonMachine probe = walker;
        if (probe.feed(static_cast<char>(byte))) allowed.push_back(static_cast<char>(byte));
      }
      ASSERT_FALSE(allowed.empty() && !walker.complete()) << "dead end after " << quoted(text);
      if (allowed.empty()) break;
      const char c = allowed[random() % allowed.size()];
      ASSERT_TRUE(walker.feed(c));
      text += c;
    }
    if (walker.complete()) EXPECT_TRUE(text_validates(text, schema)) << quoted(text);
  }
  Json too_many = branches;
  for (int i = 0; i < 25; ++i) too_many.push_back(branches[0]);
  EXPECT_THROW(compile_json_schema({{"anyOf", too_many}}, "s"), ApiError);
}

TEST(JsonSchemaMachine, NumbersAreBoundedToWhatAnInt64OrADoubleHolds) {
  const auto compiled = compile_json_schema(Json::parse(R"({"type": "number"})"), "schema");
  const auto accepts = [&](const std::string& text) {
    JsonMachine machine(*compiled);
    return machine.feed(text) && machine.complete();
  };
  const std::string twenty(JsonMachine::kMaxDigits, '9');
  EXPECT_TRUE(accepts("-" + twenty + "." + twenty + "e-99"));
  EXPECT_FALSE(accepts(twenty + "9"));
  EXPECT_FALSE(accepts("1." + twenty + "9"));
  EXPECT_FALSE(accepts("1e100"));
}

TEST(JsonSchemaMachine, KeysComeInOrderAndBoundsHold) {
  const Json schema = Json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "ab": {"type": "integer"}, "b": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}},
      "required": ["b"]})");
  const auto compiled = compile_json_schema(schema, "schema");
  const auto accepts = [&](const std::string& text) {
    JsonMachine machine(*compiled);
    return machine.feed(text) && machine.complete();
  };
  EXPECT_TRUE(accepts(R"({"a": 1, "ab": 2, "b": [1]})"));
  EXPECT_TRUE(accepts(R"({"ab": 2, "b": [1, 2]})")) << "an optional key may be left out";
  EXPECT_FALSE(accepts(R"({"b": [1], "a": 1})")) << "keys come in the schema's order";
  EXPECT_FALSE(accepts(R"({"a": 1})")) << "b is required";
  EXPECT_FALSE(accepts(R"({"a": 1, "c": 2, "b": [1]})")) << "no undeclared key";
  EXPECT_FALSE(accepts(R"({"b": []})")) << "minItems";
  EXPECT_FALSE(accepts(R"({"b": [1, 2, 3]})")) << "maxItems";
  EXPECT_FALSE(accepts(R"({"a": 1.5, "b": [1]})")) << "an integer has no fraction";
  EXPECT_FALSE(accepts(R"({"b": [1],})")) << "no trailing comma";
}

TEST(JsonSchemaCompiler, RefusesWhatItCannotFollowNamingTheKeyPath) {
  const std::vector<std::pair<std::string, std::string>> bad = {  // schema, the param named
      {R"({"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]+$"}}})",
       "s.properties.zip.pattern"},
      {R"({"type": "integer", "minimum": 0})", "s.minimum"},
      {R"({"type": "date"})", "s.type"},
      {R"({"properties": {"a": false}})", "s.properties.a"},
      {R"({"$ref": "#/$defs/missing"})", "s.$ref"},
      {R"({"$ref": "https://example.com/s.json"})", "s.$ref"},
      {R"({"$defs": {"loop": {"anyOf": [{"$ref": "#/$defs/loop"}]}}, "$ref": "#/$defs/loop"})", "s"},
      {R"({"type": "string", "enum": [1, 2]})", "s.enum"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "s.maxItems"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "s.required"},
      {R"({"type": "array", "items": [{"type": "string"}]})", "s.items"},
      {R"({"type": "string", "items": {}})", "s.items"},
      {R"({"anyOf": []})", "s.anyOf"},
      {R"({"type": "object", "anyOf": [{"type": "string"}]})", "s.anyOf[0].type"},
  };
  for (const auto& [text, param] : bad) {
    try {
      compile_json_schema(Json::parse(text), "s");
      ADD_FAILURE() << text << " compiled";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, param) << text << ": " << e.what();
    }
  }
}

TEST(JsonSchemaConstraint, LetsThroughOnlyTokensTheSchemaAllows) {
  // A vocabulary of pieces; id 8 is the end token.
  auto texts = std::make_shared<const std::vector<std::string>>(
      std::vector<std::string>{"{\"", "color", "\":", " \"", "red", "green", "\"}", "blue", ""});
  const Json schema = Json::parse(R"({"type": "object", "properties": {"color": {"enum": ["red", "green"]}},
      "required": ["color"]})");
  const JsonConstraint constraint(compile_json_schema(schema, "s"), texts, {8});
  const auto allowed = [&](const std::vector<int64_t>& generated) {
    const torch::Tensor mask = constraint.allowed(generated, 9);  // [V]
    std::vector<int64_t> ids;
    for (int64_t id = 0; id < 9; ++id) {
      if (mask[id].item<bool>()) ids.push_back(id);
    }
    return ids;
  };
  EXPECT_EQ(allowed({}), (std::vector<int64_t>{0}));
  EXPECT_EQ(allowed({0}), (std::vector<int64_t>{1}));  // the only key
  EXPECT_EQ(allowed({0, 1, 2, 3}), (std::vector<int64_t>{4, 5})) << "red or green, never blue";
  EXPECT_EQ(allowed({0, 1, 2, 3, 5}), (std::vector<int64_t>{6}));
  EXPECT_EQ(allowed({0, 1, 2, 3, 5, 6}), (std::vector<int64_t>{8})) << "whole: only the end";
}

// The mask skips probes (a token refused by its opening spaces and byte, a token of plain bytes
// inside a string): on GPT-2's vocabulary it must equal feeding every token to a copy.
TEST(JsonSchemaConstraint, ItsShortcutsGiveTheMaskOfFeedingEveryToken) {
  const auto tokenizer = tokenizer::Tokenizer::load(testing::source_dir() / "assets" / "gpt2-bpe");
  auto texts = std::make_shared<const std::vector<std::string>>(token_texts(tokenizer));
  const int64_t vocab = tokenizer.vocab_size();
  const auto schema = compile_json_schema(schemas()[0], "s");
  const std::vector<std::pair<std::shared_ptr<const JsonSchema>, std::string>> replies = {
      {json_object_schema(), ""}, {json_object_schema(), "{\"temperat"}, {json_object_schema(), "{\"a\": \"x y"},
      {json_object_schema(), "{\"a\": 21.5"}, {json_object_schema(), "{\"a\": [1, {\"c\": null}]"},
      {json_object_schema(), "{\"a\":  "}, {schema, ""}, {schema, "{\"na"}, {schema, "{\"name\": \"Ann"},
      {schema, "{\"name\": \"Ann\", \"age\": 4"}, {schema, "{\"name\": \"Ann\", \"age\": 4, \"role\": "},
      {schema, "{\"name\": \"Ann\", \"age\": 4, \"role\": 1"}};
  for (const auto& [compiled, reply] : replies) {
    const std::vector<int64_t> generated = tokenizer.encode(reply, /*add_special_tokens=*/false);
    const torch::Tensor mask = JsonConstraint(compiled, texts, {50256}).allowed(generated, vocab);  // [V]
    JsonMachine machine(*compiled);
    ASSERT_TRUE(machine.feed(reply)) << reply;
    int64_t allowed = 0;
    for (int64_t id = 0; id < vocab; ++id) {
      JsonMachine probe = machine;
      const std::string& text = (*texts)[static_cast<size_t>(id)];
      const bool expected = id == 50256 ? machine.complete() : !text.empty() && probe.feed(text);
      ASSERT_EQ(mask[id].item<bool>(), expected) << quoted(reply) << " then " << quoted(text) << " (id " << id << ")";
      allowed += expected;
    }
    EXPECT_GT(allowed, 0) << reply;
  }
}

}  // namespace
}  // namespace serve
}  // namespace dschat
