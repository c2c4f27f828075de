// The string and number keywords of schema-guided decoding (minLength, maxLength, pattern,
// format, minimum, maximum and their exclusive forms): every integer of a window and every short
// decimal accepted exactly when in bounds, lengths counted in code points, formats' near misses
// refused, UTF-8 checked as a decoder does, and on GPT-2's vocabulary the token mask equal to
// feeding every token while a string with keywords is being written (where the plain-string
// shortcut must not apply).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>

#include "dschat/tokenizer/tokenizer.h"
#include "serve/json_machine.h"
#include "serve/json_mode.h"
#include "json_mask_check.h"
#include "json_schema_reference.h"
#include "test_util.h"

namespace dschat {
namespace serve {
namespace {

using Json = nlohmann::ordered_json;

bool accepts(const JsonSchema& schema, const std::string& text) {
  JsonMachine machine(schema);
  return machine.feed(text) && machine.complete();
}

TEST(JsonSchemaKeywords, IntegersAreAcceptedExactlyWithinTheirBounds) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min(), kMax = std::numeric_limits<int64_t>::max();
  const std::vector<std::string> schemas = {
      R"({"type": "integer", "minimum": -5, "exclusiveMaximum": 100})",
      R"({"type": "integer", "minimum": 1000, "maximum": 1010})",
      R"({"type": "integer", "maximum": -20})",
      R"({"type": "integer", "exclusiveMinimum": -0.5, "maximum": 0.5})",
      R"({"type": "integer", "minimum": 9223372036854775800})",
      R"({"type": "integer", "maximum": -9223372036854775800})",
      R"({"type": "integer", "multipleOf": 7, "minimum": -30, "maximum": 1000})",
      R"({"type": "integer", "multipleOf": 5, "exclusiveMinimum": 1003})",
      R"({"type": "integer", "multipleOf": 1000000007})",
  };
  for (const std::string& text : schemas) {
    const Json schema = Json::parse(text);
    const auto compiled = compile_json_schema(schema, "s");
    const JsonSchemaNode& node = compiled->nodes[static_cast<size_t>(compiled->root)];
    for (int64_t centre : {int64_t{0}, int64_t{1005}, kMin + 5, kMax - 5}) {
      for (int64_t delta = -1100; delta <= 1100; ++delta) {
        if ((delta < 0 && centre < kMin - delta) || (delta > 0 && centre > kMax - delta)) continue;
        const int64_t value = centre + delta;
        const bool inside =
            value >= node.minimum && value <= node.maximum && (node.multiple_of == 0 || value % node.multiple_of == 0);
        ASSERT_EQ(accepts(*compiled, std::to_string(value)), inside) << text << ": " << value;
        ASSERT_EQ(inside, reference::text_validates(std::to_string(value), schema)) << text << ": " << value;
      }
    }
    EXPECT_FALSE(accepts(*compiled, "99999999999999999999")) << text << ": past int64";
  }
  const auto zero = compile_json_schema(Json::parse(R"({"type": "integer", "minimum": 0, "maximum": 3})"), "s");
  EXPECT_TRUE(accepts(*zero, "-0"));  // -0 == 0
  EXPECT_FALSE(accepts(*zero, "-1"));
  JsonMachine machine(*zero);
  EXPECT_FALSE(machine.feed("4")) << "refused at its first digit: no integer in bounds begins with 4";
  const auto sevens = compile_json_schema(Json::parse(R"({"type": "integer", "multipleOf": 7, "maximum": 20})"), "s");
  JsonMachine two(*sevens);
  EXPECT_FALSE(two.feed("2")) << "2, 20..29 and longer hold no multiple of 7 up to 20";
  const auto negative = compile_json_schema(Json::parse(R"({"type": "integer", "minimum": 10})"), "s");
  JsonMachine sign(*negative);
  EXPECT_FALSE(sign.feed('-')) << "no negative integer is in bounds";
}

// Numbers with a fraction against their bounds, on every decimal of up to 3 integer and 2
// fraction digits either side of 0: accepted exactly when the reference (the parsed double against
// the bound's double, as a validator compares) says they are in bounds.
TEST(JsonSchemaKeywords, NumbersAreAcceptedExactlyWithinTheirBounds) {
  const std::vector<std::string> schemas = {
      R"({"type": "number", "minimum": 0, "exclusiveMaximum": 100.5})",
      R"({"type": "number", "exclusiveMinimum": -1.25, "maximum": 0.75})",
      R"({"type": "number", "minimum": 0.1, "maximum": 0.3})",
      R"({"type": "number", "exclusiveMinimum": 5})",
      R"({"type": "number", "maximum": -99.99})",
      R"({"type": "number", "minimum": 2, "maximum": 2})",
      R"({"type": "number", "minimum": -1, "exclusiveMinimum": -1, "maximum": 1, "exclusiveMaximum": 1})",
  };
  for (const std::string& text : schemas) {
    const Json schema = Json::parse(text);
    const auto compiled = compile_json_schema(schema, "s");
    int inside = 0;
    for (int whole = -130; whole <= 130; ++whole) {
      const std::string sign = whole < 0 ? "-" : "";
      const std::string digits = std::to_string(std::abs(whole));
      std::vector<std::string> numbers = {std::to_string(whole)};
      if (whole == 0) numbers.push_back("-0");
      for (int hundredths = 0; hundredths < 100; ++hundredths) {
        const std::string two = (hundredths < 10 ? "0" : "") + std::to_string(hundredths);
        numbers.push_back(sign + digits + "." + two);
        if (hundredths % 10 == 0) numbers.push_back(sign + digits + "." + two.substr(0, 1));
      }
      for (const std::string& number : numbers) {
        const bool valid = reference::text_validates(number, schema);
        ASSERT_EQ(accepts(*compiled, number), valid) << text << ": " << number;
        inside += valid;
      }
    }
    EXPECT_GT(inside, 0) << text;
    EXPECT_FALSE(accepts(*compiled, "1e1")) << text << ": no exponent where bounded";
  }
  const auto positive = compile_json_schema(Json::parse(R"({"type": "number", "exclusiveMinimum": 0})"), "s");
  EXPECT_TRUE(accepts(*positive, "0.000000000000001"));
  EXPECT_TRUE(accepts(*positive, "123456789012345"));
  EXPECT_FALSE(accepts(*positive, "1234567890123456")) << "16 significant digits";
  EXPECT_FALSE(accepts(*positive, "0.1234567890123456")) << "16 significant digits";
  JsonMachine zero(*positive);
  EXPECT_TRUE(zero.feed("0.0")) << "0.01 may still follow";
  EXPECT_FALSE(zero.complete()) << "0.0 is not above 0";
  JsonMachine sign(*positive);
  EXPECT_FALSE(sign.feed('-'));
}

TEST(JsonSchemaKeywords, LengthsCountCodePointsWrittenAnyWay) {
  const auto compiled =
      compile_json_schema(Json::parse(R"({"type": "string", "minLength": 2, "maxLength": 3})"), "s");
  EXPECT_TRUE(accepts(*compiled, "\"ab\""));
  EXPECT_TRUE(accepts(*compiled, "\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\""));  // 3 code points, 9 bytes
  EXPECT_TRUE(accepts(*compiled, "\"\\u00e9\\n\""));                            // escapes: 2 code points
  EXPECT_FALSE(accepts(*compiled, "\"\xc3\xa9\""));                             // 1
  EXPECT_FALSE(accepts(*compiled, "\"abcd\""));                                 // 4
  JsonMachine machine(*compiled);
  EXPECT_FALSE(machine.feed("\"abc\\")) << "an escape would write a fourth code point";
  for (const std::string bad : {"\"a\xc0\x80", "\"a\xed\xa0\x80", "\"a\xf4\x90\x80\x80", "\"a\x80", "\"a\\ud800"}) {
    JsonMachine probe(*compiled);
    EXPECT_FALSE(probe.feed(bad)) << reference::quoted(bad) << ": not a character";
  }
  // A pattern that takes ASCII only: a UTF-8 lead byte is refused at once (no dead end after it).
  const auto ascii = compile_json_schema(Json::parse(R"({"type": "string", "pattern": "^[a-z]*$"})"), "s");
  JsonMachine lead(*ascii);
  EXPECT_FALSE(lead.feed("\"a\xc3"));
  JsonMachine escape(*ascii);
  EXPECT_TRUE(escape.feed("\"a\\u006")) << "\\u0061 is 'a'";
  EXPECT_FALSE(escape.feed('0')) << "\\u0060 is '`'";
}

TEST(JsonSchemaKeywords, FormatsRefuseTheirNearMisses) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"date", {"2024-02-30", "2023-04-31", "2023-13-01", "0000-01-01", "2023-1-01", "2023-01-01T"}},
      {"date-time",
       {"2024-01-01t00:00:00Z", "2024-01-01T24:00:00Z", "2024-01-01T00:00:00", "2024-01-01T00:00:00+1:00"}},
      {"time", {"12:00:00", "12:60:00Z", "12:00:00.Z"}},
      {"uuid", {"123e4567e89b-12d3-a456-426614174000", "123e4567-e89b-12d3-a456-42661417400g"}},
      {"ipv4", {"256.1.1.1", "01.1.1.1", "1.1.1", "1.1.1.1.1"}},
      {"email", {"a@b", "@b.co", "a@@b.co"}},
      {"uri", {"http//x", "http://", "http://a b", "http://x/%zz", "http://-x.com"}},
  };
  const std::vector<std::pair<std::string, std::string>> good = {
      {"date", "2024-02-28"}, {"date-time", "2024-01-01T23:59:59.123456-08:00"}, {"time", "00:00:00Z"},
      {"uuid", "123E4567-e89b-12d3-a456-426614174000"}, {"ipv4", "0.10.200.255"},
      {"email", "first.last+x@mail.example.org"}, {"uri", "https://example.com:8080/a/b%20c?q=1&r=/x#frag"}};
  for (const auto& [format, misses] : cases) {
    const Json schema = {{"type", "string"}, {"format", format}};
    const auto compiled = compile_json_schema(schema, "s");
    for (const std::string& miss : misses) {
      EXPECT_FALSE(accepts(*compiled, Json(miss).dump())) << format << ": " << miss;
    }
  }
  for (const auto& [format, text] : good) {
    const Json schema = {{"type", "string"}, {"format", format}};
    EXPECT_TRUE(accepts(*compile_json_schema(schema, "s"), Json(text).dump())) << format << ": " << text;
    EXPECT_TRUE(reference::text_validates(Json(text).dump(), schema)) << format << ": " << text;
  }
}

// Inside a string with keywords every token is probed: the mask must equal feeding each token.
TEST(JsonSchemaKeywords, TheMaskInsideAStringWithKeywordsIsFeedingEveryToken) {
  const auto tokenizer = tokenizer::Tokenizer::load(testing::source_dir() / "assets" / "gpt2-bpe");
  auto texts = std::make_shared<const std::vector<std::string>>(token_texts(tokenizer));
  const int64_t vocab = tokenizer.vocab_size();
  const auto schema = compile_json_schema(Json::parse(R"({"type": "object", "properties": {
      "zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "name": {"type": "string", "maxLength": 6},
      "n": {"type": "integer", "minimum": 10, "maximum": 19}}, "required": ["zip", "name", "n"]})"), "s");
  const std::vector<std::string> replies = {"{\"zip\": \"12", "{\"zip\": \"12345\", \"name\": \"Ann",
                                            "{\"zip\": \"12345\", \"name\": \"\", \"n\": 1"};
  for (const std::string& reply : replies) {
    const int64_t allowed = expect_mask_is_feeding_every_token(schema, texts, tokenizer, reply);
    EXPECT_GT(allowed, 0) << reply;
    EXPECT_LT(allowed, vocab / 2) << reply << ": the keywords narrow the tokens";
  }
}

}  // namespace
}  // namespace serve
}  // namespace dschat
