// JSON mode (serve/json_mode.h): the byte machine (json_machine.h) on JSON mode's schema accepts a
// text exactly when nlohmann's RFC 8259 parser does and it is one object (random objects, then
// the same with one byte changed), every prefix of a valid object on the way; and the token
// constraint built on it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>

#include "serve/json_machine.h"
#include "serve/json_mode.h"
#include "json_text_mutation.h"

namespace dschat {
namespace serve {
namespace {

JsonMachine object_machine() { return JsonMachine(*json_object_schema()); }

bool machine_accepts(const std::string& text) {
  JsonMachine machine = object_machine();
  return machine.feed(text) && machine.complete();
}

// An object the way a model might write it: nested values of every kind, random blanks.
std::string random_object(std::mt19937& random, int depth);

std::string blank(std::mt19937& random) {
  static const char* const kBlanks[] = {"", "", "", " ", "\n", "  ", "\t", "\r\n"};
  return kBlanks[random() % 8];
}

std::string random_value(std::mt19937& random, int depth) {
  static const char* const kScalars[] = {"0",   "-0",  "12",    "3.25", "-4.5e10", "6E-2", "7e+3", "true",
                                         "false", "null", "\"\"", "\"a b\"", "\"q\\\"\\\\\\/\\b\\f\\n\\r\\t\"",
                                         "\"\\u00e9\\uABCD\"", "\"h\xc3\xa9llo\""};
  const int kind = depth >= 3 ? 0 : static_cast<int>(random() % 4);
  if (kind == 1) return random_object(random, depth + 1);
  if (kind == 2) {
    std::string array = "[" + blank(random);
    const int items = static_cast<int>(random() % 3);
    for (int i = 0; i < items; ++i) {
      array += (i ? "," + blank(random) : "") + random_value(random, depth + 1) + blank(random);
    }
    return array + "]";
  }
  return kScalars[random() % 15];
}

std::string random_object(std::mt19937& random, int depth) {
  std::string object = "{" + blank(random);
  const int members = static_cast<int>(random() % 4);
  for (int i = 0; i < members; ++i) {
    if (i) object += "," + blank(random);
    object += "\"k" + std::to_string(random() % 100) + "\"" + blank(random) + ":" + blank(random) +
              random_value(random, depth) + blank(random);
  }
  return object + "}";
}

TEST(JsonModeMachine, AcceptsExactlyWhatAnRfc8259ParserAcceptsAsOneObject) {
  std::mt19937 random(11);
  const std::string alphabet = "{}[]\",:0123456789.-+eEtrufalsn\\ u";
  int valid = 0, mutated_valid = 0, mutated_invalid = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string text = blank(random) + random_object(random, 0);
    ASSERT_TRUE(nlohmann::json::accept(text)) << text;
    ASSERT_TRUE(machine_accepts(text)) << text;
    ++valid;
    JsonMachine machine = object_machine();  // every proper prefix goes in, and none is complete
    for (size_t i = 0; i + 1 < text.size(); ++i) {
      ASSERT_TRUE(machine.feed(text[i])) << text << " at " << i;
      ASSERT_FALSE(machine.complete()) << text << " at " << i;
    }
    // One byte replaced, inserted or deleted: both must agree (the machine takes no trailing
    // blanks, since the reply ends with its object, so texts ending in one are not compared).
    const std::string mutated = one_byte_changed(text, alphabet, random);
    if (mutated.empty() || mutated.find_last_not_of(" \t\r\n") != mutated.size() - 1) continue;
    // Nor a change that split a UTF-8 character: the machine does not check UTF-8 (a byte-level
    // token's text may hold part of one), the parser does.
    if (!valid_utf8(mutated)) continue;
    bool reference = false;
    try {
      reference = nlohmann::json::parse(mutated).is_object();
    } catch (const nlohmann::json::exception&) {
    }
    const auto quoted = [](const std::string& t) {
      return nlohmann::json(t).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    };
    EXPECT_EQ(machine_accepts(mutated), reference) << quoted(text) << " became " << quoted(mutated);
    (reference ? mutated_valid : mutated_invalid) += 1;
  }
  EXPECT_EQ(valid, 3000);
  EXPECT_GT(mutated_valid, 100);  // both sides of the comparison were exercised
  EXPECT_GT(mutated_invalid, 1000);
}

TEST(JsonModeMachine, RefusesWhatIsNotAnObjectOrRunsOn) {
  for (const std::string text : {"[1]", "\"x\"", "1", "{\"a\" 1}", "{a: 1}", "{\"a\": 01}", "{\"a\": 1.}",
                                 "{\"a\": tru}", "{\"a\": \"x\ny\"}", "{\"a\": 1,}", "{} ", "{}}", "{\"a\": -}",
                                 "{\"a\": \"\\x\"}", "{\"a\": \"\\u12G4\"}", "{\"a\": [1 2]}"}) {
    EXPECT_FALSE(machine_accepts(text)) << text;
  }
  JsonMachine blanks = object_machine();
  EXPECT_TRUE(blanks.feed("{" + std::string(JsonMachine::kMaxWhitespace, ' ')));
  EXPECT_FALSE(blanks.feed(' ')) << "a run of blanks is bounded";
  JsonMachine deep = object_machine();
  EXPECT_TRUE(deep.feed("{\"a\":" + std::string(JsonMachine::kMaxDepth - 1, '[')));
  EXPECT_FALSE(deep.feed('[')) << "nesting is bounded";
}

TEST(JsonModeConstraint, LetsThroughTokensThatKeepAnObjectAndEndsOnlyWhenClosed) {
  // A vocabulary of pieces; id 9 is special (empty text), id 10 the end token.
  auto texts = std::make_shared<const std::vector<std::string>>(std::vector<std::string>{
      "{", "}", "\"", "a", ":", " 1", "{\"", "\"}", "Sure", "", ""});
  const JsonConstraint constraint(json_object_schema(), texts, {10});
  const auto allowed = [&](const std::vector<int64_t>& generated) {
    const torch::Tensor mask = constraint.allowed(generated, 12);  // [V]: two more ids than texts
    std::vector<int64_t> ids;
    for (int64_t id = 0; id < 12; ++id) {
      if (mask[id].item<bool>()) ids.push_back(id);
    }
    return ids;
  };
  EXPECT_EQ(allowed({}), (std::vector<int64_t>{0, 6}));           // only an object may start
  EXPECT_EQ(allowed({0}), (std::vector<int64_t>{1, 2, 7}));  // a key (a "} starts one) or the end
  // Inside a key any text, but not "} (the key would close, then no colon).
  EXPECT_EQ(allowed({6, 3}), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 8}));
  EXPECT_EQ(allowed({6, 3, 2, 4}), (std::vector<int64_t>{0, 2, 5, 6, 7}));  // a value
  EXPECT_EQ(allowed({6, 3, 2, 4, 5}), (std::vector<int64_t>{1}));  // after 1: close (or more digits: none here)
  EXPECT_EQ(allowed({6, 3, 2, 4, 5, 1}), (std::vector<int64_t>{10}));  // closed: only the end token
  EXPECT_EQ(allowed({8}), (std::vector<int64_t>{10})) << "a reply that is already no JSON can only end";
}

}  // namespace
}  // namespace serve
}  // namespace dschat
