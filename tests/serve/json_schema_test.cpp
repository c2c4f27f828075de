// Schema-guided decoding (serve/json_schema.h, serve/json_machine.h) against a validator written
// as JSON Schema defines validation (json_schema_reference.h: a recursive check of the parsed value):
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
#include "json_mask_check.h"
#include "json_schema_reference.h"
#include "json_text_mutation.h"
#include "test_util.h"

namespace dschat {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;
using reference::instance;
using reference::quoted;
using reference::text_validates;

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
      Json::parse(R"({"discriminator": {"propertyName": "kind"}, "anyOf": [
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
      // Strings' and integers' keywords (examples: what the generator writes for such strings).
      Json::parse(R"({"type": "object", "properties": {
          "zip": {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$", "examples": ["12345", "12345-6789"]},
          "code": {"type": "string", "minLength": 2, "maxLength": 4, "examples": ["ab", "\u00e9t\u00e9", "a\"b"]},
          "when": {"type": "string", "format": "date-time",
                   "examples": ["2024-02-28T12:00:00Z", "1999-12-31T23:59:59.5+01:00"]},
          "n": {"type": "integer", "minimum": -5, "exclusiveMaximum": 100},
          "word": {"type": "string", "pattern": "ab+c", "minLength": 4, "maxLength": 6,
                   "examples": ["abbc", "xabc", "abcyz", "\u4e2dabbbc"]},
          "pick": {"enum": ["a", "bb", "ccc", 5, 50], "maxLength": 2, "maximum": 10},
          "price": {"type": "number", "minimum": 0, "exclusiveMaximum": 1000.5, "examples": [0, 12.5, 1000.25, 999]},
          "ratio": {"type": "number", "exclusiveMinimum": -1.25, "maximum": 0.75, "examples": [-1.2, 0, 0.75]}},
        "required": ["zip", "n"]})"),
      Json::parse(R"({"type": "array", "items": {"anyOf": [
          {"type": "string", "format": "date", "examples": ["2000-02-28", "0001-01-01"]},
          {"type": "string", "format": "uuid", "examples": ["123e4567-e89b-12d3-A456-426614174000"]},
          {"type": "string", "format": "ipv4", "examples": ["192.168.0.1", "255.0.10.9"]},
          {"type": "string", "format": "uri", "maxLength": 40, "examples": ["http://a.b/c?d#e", "ftp://x:21/%41"]},
          {"type": "integer", "minimum": 1000, "maximum": 1010},
          {"type": "integer", "maximum": -20}]}})"),
      // Tuples, as Pydantic writes Tuple[int, str, Literal] and as drafts before 2020-12 did.
      Json::parse(R"({"type": "array", "prefixItems": [{"type": "integer", "minimum": 0},
          {"type": "string", "maxLength": 3, "examples": ["a", "xyz"]}, {"enum": ["x", "y"]}],
        "items": false, "minItems": 2})"),
      Json::parse(R"({"type": "array", "items": [{"type": "boolean"}], "additionalItems": {"type": "null"},
        "maxItems": 3})"),
      // Pydantic v1's described reference: allOf of one $ref beside a description.
      Json::parse(R"({"definitions": {"Color": {"enum": ["red", "green"], "type": "string"}}, "type": "object",
        "properties": {"color": {"allOf": [{"$ref": "#/definitions/Color"}], "description": "the color"},
          "n": {"allOf": [{"type": "integer"}], "maximum": 5}}, "required": ["color"]})"),
  };
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
      {R"({"type": "object", "properties": {"zip": {"type": "string", "pattern": "^(a)\\1$"}}})",
       "s.properties.zip.pattern"},
      {R"({"type": "number", "minimum": 0.1234567890123456})", "s.minimum"},
      {R"({"type": "number", "exclusiveMinimum": 1, "maximum": 1})", "s"},
      {R"({"type": "array", "uniqueItems": true})", "s.uniqueItems"},
      {R"({"allOf": [{"type": "integer"}, {"minimum": 0}]})", "s.allOf"},
      {R"({"type": "number", "multipleOf": 0.5})", "s.multipleOf"},
      {R"({"type": "integer", "multipleOf": 0})", "s.multipleOf"},
      {R"({"type": "integer", "multipleOf": 4, "minimum": 1, "maximum": 3})", "s"},
      {R"({"type": "string", "format": "hostname"})", "s.format"},
      {R"({"type": "string", "format": "date", "pattern": "^2"})", "s.format"},
      {R"({"type": "string", "pattern": "^a{3}$", "maxLength": 2})", "s.pattern"},
      {R"({"type": "string", "minLength": 3, "maxLength": 2})", "s.maxLength"},
      {R"({"type": "string", "pattern": "^a+$", "maxLength": 5000})", "s.maxLength"},
      {R"({"type": "string", "minimum": 1})", "s.minimum"},
      {R"({"type": "integer", "minLength": 1})", "s.minLength"},
      {R"({"type": "integer", "minimum": 5, "exclusiveMaximum": 5})", "s"},
      {R"({"type": "integer", "maximum": "9"})", "s.maximum"},
      {R"({"enum": ["abc", "de"], "maxLength": 1})", "s.enum"},
      {R"({"type": "date"})", "s.type"},
      {R"({"properties": {"a": false}})", "s.properties.a"},
      {R"({"$ref": "#/$defs/missing"})", "s.$ref"},
      {R"({"$ref": "https://example.com/s.json"})", "s.$ref"},
      {R"({"$defs": {"loop": {"anyOf": [{"$ref": "#/$defs/loop"}]}}, "$ref": "#/$defs/loop"})", "s"},
      {R"({"type": "string", "enum": [1, 2]})", "s.enum"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "s.maxItems"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "s.required"},
      {R"({"type": "array", "prefixItems": [{}], "items": false, "minItems": 2})", "s.items"},
      {R"({"type": "array", "additionalItems": false})", "s.additionalItems"},
      {R"({"type": "array", "prefixItems": {"type": "string"}})", "s.prefixItems"},
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
  const auto schema = compile_json_schema(schemas()[0], "s");
  const std::vector<std::pair<std::shared_ptr<const JsonSchema>, std::string>> replies = {
      {json_object_schema(), ""}, {json_object_schema(), "{\"temperat"}, {json_object_schema(), "{\"a\": \"x y"},
      {json_object_schema(), "{\"a\": 21.5"}, {json_object_schema(), "{\"a\": [1, {\"c\": null}]"},
      {json_object_schema(), "{\"a\":  "}, {schema, ""}, {schema, "{\"na"}, {schema, "{\"name\": \"Ann"},
      {schema, "{\"name\": \"Ann\", \"age\": 4"}, {schema, "{\"name\": \"Ann\", \"age\": 4, \"role\": "},
      {schema, "{\"name\": \"Ann\", \"age\": 4, \"role\": 1"}};
  for (const auto& [compiled, reply] : replies) {
    EXPECT_GT(expect_mask_is_feeding_every_token(compiled, texts, tokenizer, reply), 0) << reply;
  }
}

}  // namespace
}  // namespace serve
}  // namespace dschat
