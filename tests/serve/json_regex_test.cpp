// JSON Schema patterns for schema-guided decoding (serve/json_regex.h) against the C++ standard
// library's ECMAScript regex (std::wregex, the dialect JSON Schema names) on random strings: what
// the automaton matches, std::regex_search matches, and on ASCII strings the two agree exactly
// (JsonRegex keeps \D \W \S and negated classes holding them to ASCII, which Python's `re` and
// ECMA-262 read alike). Match distances against brute force; unsupported patterns named.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <string>
#include <vector>

#include "serve/json_regex.h"
#include "serve/openai_protocol.h"
#include "json_schema_reference.h"

namespace dschat {
namespace serve {
namespace {

bool automaton_matches(const JsonRegex& regex, const std::u32string& text) {
  JsonRegex::States states = JsonRegex::start();
  for (char32_t c : text) {
    states = regex.step(states, static_cast<uint32_t>(c));
    if (JsonRegex::empty(states)) return false;
  }
  return regex.matches(states);
}

// The pattern's UTF-8 bytes as wide characters, for std::wregex.
std::wstring widened(const std::string& utf8) {
  const std::u32string points = reference::code_points(utf8);
  return std::wstring(points.begin(), points.end());
}

const std::vector<std::string>& patterns() {
  static const std::vector<std::string> list = {
      "^[0-9]{5}(-[0-9]{4})?$",
      "^\\d{3}-\\d{2,4}$",
      "ab+c",
      "a|bq",  // no anchors: a search
      "(?:x|yz)*q$",
      "^[^a-c]+$",
      "^[\\w.-]+@[a-z]+\\.(com|org)$",
      "^\\S+\\s\\S+$",
      "^(?:[A-Fa-f0-9]{2}:){2}[A-Fa-f0-9]{2}$",
      "^.{2,3}$",
      "\\$\\^\\.\\*x",
      "^[a\\-z]*?$",
      "^\u00e9+[\u00e0-\u00ff]$",
      "^[^\\d]{1,2}\\D$",
      "^(a|ab)(c|bcd)(d*)$",
      "^\\x41\\u0042[\\t\\n]?$",
      "^\\[\\]\\{\\}$",
  };
  return list;
}

TEST(JsonRegex, MatchesAsEcmaScriptSearchesOnRandomStrings) {
  const std::u32string alphabet = U"abcdgmoqrxyz0123456789-_.@:AFf \t\n\u00e9\u00e0\u00ff\u4e2d$^*[]{}B";
  std::mt19937 random(11);
  for (const std::string& pattern : patterns()) {
    const JsonRegex regex(pattern, "p", /*length_horizon=*/16);
    const std::wregex oracle(widened(pattern), std::regex::ECMAScript);
    int matched = 0;
    for (int trial = 0; trial < 3000; ++trial) {
      // Half the strings drawn freely, half walked through the automaton (each character one it
      // can step on), so matches and near misses are common; the oracle judges both alike.
      std::u32string text;
      if (trial % 2 == 0) {
        for (size_t n = random() % 12; n > 0; --n) text.push_back(alphabet[random() % alphabet.size()]);
      } else {
        JsonRegex::States states = JsonRegex::start();
        for (int n = 0; n < 24 && !(regex.matches(states) && random() % 3 == 0); ++n) {
          // The characters the automaton steps on, and those nearest a match (fewest more needed).
          std::vector<char32_t> viable, nearest;
          int64_t best = 99;
          for (char32_t c : alphabet) {
            const JsonRegex::States next = regex.step(states, static_cast<uint32_t>(c));
            if (JsonRegex::empty(next)) continue;
            viable.push_back(c);
            int64_t distance = 0;
            while (distance < 16 && !regex.can_match_within(next, distance, distance)) ++distance;
            if (distance < best) nearest.clear();
            if (distance <= best) nearest.push_back(c);
            best = std::min(best, distance);
          }
          if (viable.empty()) break;
          const std::vector<char32_t>& pool = random() % 2 == 0 ? nearest : viable;
          const char32_t c = pool[random() % pool.size()];
          states = regex.step(states, static_cast<uint32_t>(c));
          text.push_back(c);
        }
      }
      const std::wstring wide(text.begin(), text.end());
      const bool expected = std::regex_search(wide, oracle);
      const bool got = automaton_matches(regex, text);
      bool ascii = true;
      for (char32_t c : text) ascii = ascii && c < 0x80;
      if (ascii) {
        ASSERT_EQ(got, expected) << pattern << " on \"" << std::string(text.begin(), text.end()) << "\"";
      } else {
        ASSERT_TRUE(!got || expected) << pattern << ": matched a string ECMAScript does not";
      }
      matched += got;
    }
    EXPECT_GT(matched, 200) << pattern << ": too few matches to compare";
  }
}

// Python's `re` (the jsonschema package's matcher) reads \d \w \s as Unicode classes, ECMA-262 as
// ASCII ones: an Arabic-Indic digit is \D to ECMA-262 but not to Python, 'é' is \W to ECMA-262 but
// \w to Python. Their negations are kept to ASCII, so neither is generated.
TEST(JsonRegex, NegatedShorthandsKeepToWhatPythonAlsoMatches) {
  const std::vector<std::pair<std::string, char32_t>> refused = {
      {"^\\D$", U'\u0663'}, {"^[^\\d]$", U'\u0663'}, {"^\\W$", U'\u00e9'}, {"^[^\\w]$", U'\u00e9'},
      {"^\\S$", U'\u00e9'}};
  for (const auto& [pattern, c] : refused) {
    EXPECT_FALSE(automaton_matches(JsonRegex(pattern, "p"), std::u32string(1, c))) << pattern;
    EXPECT_TRUE(automaton_matches(JsonRegex(pattern, "p"), U"#")) << pattern;
  }
  EXPECT_TRUE(automaton_matches(JsonRegex("^[^a]$", "p"), U"\u00e9")) << "a class of literals negates fully";
}

TEST(JsonRegex, MatchDistancesEqualBruteForce) {
  // Over the alphabet {a, b, c}: after each prefix, can_match_within(states, L, L) must say
  // whether some completion of exactly L letters matches.
  const std::vector<std::string> list = {"^(ab|c)*a?$", "^a{2,4}(bc)+$", "^(aa)+$", "b", "^(a|bcc)(c|ab)?$"};
  const std::string letters = "abc";
  for (const std::string& pattern : list) {
    const JsonRegex regex(pattern, "p", /*length_horizon=*/8);
    const std::regex oracle(pattern, std::regex::ECMAScript);
    for (int prefix_code = 0; prefix_code < 40; ++prefix_code) {
      std::string prefix;
      for (int code = prefix_code; code > 0; code /= 4) prefix += letters[static_cast<size_t>(code % 3)];
      JsonRegex::States states = JsonRegex::start();
      for (char c : prefix) states = regex.step(states, static_cast<uint32_t>(c));
      if (JsonRegex::empty(states)) continue;
      for (int length = 0; length <= 6; ++length) {
        bool exists = false;
        int count = 1;
        for (int i = 0; i < length; ++i) count *= 3;
        for (int code = 0; code < count && !exists; ++code) {
          std::string text = prefix;
          for (int i = 0, rest = code; i < length; ++i, rest /= 3) text += letters[static_cast<size_t>(rest % 3)];
          exists = std::regex_search(text, oracle);
        }
        EXPECT_EQ(regex.can_match_within(states, length, length), exists)
            << pattern << " after \"" << prefix << "\", " << length << " more";
      }
    }
  }
}

TEST(JsonRegex, RefusesWhatItCannotFollowNamingWhere) {
  const std::vector<std::string> bad = {
      "(a)\\1",      // backreference
      "a(?=b)",      // lookahead
      "(?<n>a)",     // named group
      "\\bword",     // word boundary
      "a^b",         // an anchor inside
      "^a|b$",       // anchors over a top-level |
      "a{2,1}",      // m below n
      "a{x}",        // no quantifier
      "*a",          // nothing to repeat
      "a**",         // a repeated quantifier
      "(ab",         // unclosed group
      "ab)",         // unmatched )
      "[ab",         // unclosed class
      "[z-a]",       // range out of order
      "\\p{L}",      // property escape
      "[^\\s\\S]",   // matches nothing
      "^(?:[a-z]{20}){7}$",  // 140 classes once expanded
      "a{1001}",     // repeat bound
  };
  for (const std::string& pattern : bad) {
    try {
      JsonRegex regex(pattern, "schema.pattern");
      ADD_FAILURE() << pattern << " compiled";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "schema.pattern") << pattern << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(pattern), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace serve
}  // namespace dschat
