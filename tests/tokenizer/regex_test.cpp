// The Oniguruma regex wrapper and the Split pre-tokenizer without Python: match iteration as the
// `onig` crate does it, the Unicode widening of \p{L}/\p{N}, literal patterns, errors, threads.
// The expected pieces were computed with `tokenizers` 0.23.3 (pre_tokenizers.Split).

#include <thread>

#include "test_util.h"
#include "tokenizer/json_spec.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

using Matches = std::vector<Regex::Match>;
using Words = std::vector<std::string>;

const char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Matches find_all(const Regex& regex, const std::string& text) {
  Matches out;
  regex.find_all(text, out);
  return out;
}

Words split(const nlohmann::json& spec, const std::string& text) {
  std::vector<Piece> pieces{Piece{text, true}};
  make_pre_tokenizer(JsonSpec(spec, "test"))->pre_tokenize(pieces);
  Words out;
  for (const Piece& piece : pieces) out.push_back(piece.text);
  return out;
}

nlohmann::json split_spec(nlohmann::json pattern, const char* behavior, bool invert) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

TEST(TokenizerRegex, EmptyMatchesFollowTheOnigCrate) {
  // An empty match advances one code point; one right after a non-empty match is skipped.
  Regex digits("\\d*", "test");
  EXPECT_EQ(find_all(digits, "a1bbb2"), (Matches{{0, 0}, {1, 2}, {3, 3}, {4, 4}, {5, 6}}));
  EXPECT_EQ(find_all(Regex("\\b", "test"), "test string"), (Matches{{0, 0}, {4, 4}, {5, 5}, {11, 11}}));
  EXPECT_EQ(find_all(Regex("x*", "test"), "\xC3\xA9x"), (Matches{{0, 0}, {2, 3}}));
}

TEST(TokenizerRegex, LookaroundSeesTheWholePiece) {
  EXPECT_EQ(find_all(Regex("(?<=a)b", "test"), "abbab"), (Matches{{1, 2}, {4, 5}}));
  // \s+(?!\S) leaves the last space of a run to the next word.
  EXPECT_EQ(find_all(Regex("\\s+(?!\\S)", "test"), "a   b  "), (Matches{{1, 3}, {5, 7}}));
}

TEST(TokenizerRegex, Qwen2PatternSplitsAsTokenizers) {
  nlohmann::json spec = split_spec({{"Regex", kQwen2Pattern}}, "Isolated", false);
  EXPECT_EQ(split(spec, "I'M  you're 12 ok\n\n"), (Words{"I", "'M", " ", " you", "'re", " ", "1", "2", " ok", "\n\n"}));
  EXPECT_EQ(split(spec, "Hello,   world!\r\n\tx"), (Words{"Hello", ",", "  ", " world", "!\r\n", "\tx"}));
  // (?i:'s) also matches U+017F LATIN SMALL LETTER LONG S, which case-folds to 's'.
  EXPECT_EQ(split(spec, "$abc \xC5\xBF'S"), (Words{"$abc", " \xC5\xBF", "'S"}));
}

TEST(TokenizerRegex, EveryBehaviorOfAStringPattern) {
  const std::string text = "the-final--countdown-";
  auto cut = [&](const char* behavior, bool invert) { return split(split_spec({{"String", "-"}}, behavior, invert), text); };
  EXPECT_EQ(cut("Removed", false), (Words{"the", "final", "countdown"}));
  EXPECT_EQ(cut("Removed", true), (Words{"-", "-", "-", "-"}));
  EXPECT_EQ(cut("Isolated", false), (Words{"the", "-", "final", "-", "-", "countdown", "-"}));
  EXPECT_EQ(cut("MergedWithPrevious", false), (Words{"the-", "final-", "-", "countdown-"}));
  EXPECT_EQ(cut("MergedWithPrevious", true), (Words{"the", "-final", "-", "-countdown", "-"}));
  EXPECT_EQ(cut("MergedWithNext", false), (Words{"the", "-final", "-", "-countdown", "-"}));
  EXPECT_EQ(cut("MergedWithNext", true), (Words{"the-", "final-", "-", "countdown-"}));
  EXPECT_EQ(cut("Contiguous", false), (Words{"the", "-", "final", "--", "countdown", "-"}));
}

TEST(TokenizerRegex, StringPatternsAreLiteral) {
  Regex dot = Regex::literal("a.b", "test");
  EXPECT_EQ(find_all(dot, "axb a.b"), (Matches{{4, 7}}));
  EXPECT_EQ(find_all(Regex::literal("[x]+", "test"), "[x]+x"), (Matches{{0, 4}}));
  EXPECT_EQ(find_all(Regex::literal("\xC3\xA9 ", "test"), "e \xC3\xA9 "), (Matches{{2, 5}}));
}

TEST(TokenizerRegex, LetterAndNumberPropertiesAreWidened) {
  std::string letters = widen_unicode_properties("\\p{L}");
  EXPECT_EQ(letters.rfind("[\\p{L}\\x{", 0), 0u) << letters;
  EXPECT_NE(letters.find("\\x{105C0}-\\x{105F3}"), std::string::npos) << "Todhri (Unicode 16.0)";
  EXPECT_EQ(widen_unicode_properties("\\P{N}").rfind("[^\\p{N}\\x{", 0), 0u);
  EXPECT_EQ(widen_unicode_properties("\\p{^Letter}").rfind("[^\\p{L}", 0), 0u);
  EXPECT_EQ(widen_unicode_properties("[^\\s\\p{L}]").rfind("[^\\s[\\p{L}", 0), 0u);
  // Escaped backslashes and other properties are left alone.
  EXPECT_EQ(widen_unicode_properties("\\\\p{L}"), "\\\\p{L}");
  EXPECT_EQ(widen_unicode_properties("\\p{Lu}\\p{Han}"), "\\p{Lu}\\p{Han}");
}

// \p{L}, \p{N} and \s of every code point equal char_class, which UnicodeClassSlow checks against
// `tokenizers`; without the widening Debian's Oniguruma (Unicode 14.0) misses 4,388 of them.
TEST(TokenizerRegex, PropertiesOfEveryCodePointMatchTheClassTable) {
  const std::pair<const char*, uint8_t> properties[] = {{"\\p{L}", kLetter}, {"\\p{N}", kNumber}, {"\\s", kSpace}};
  for (const auto& [pattern, bit] : properties) {
    Regex regex(pattern, "test");
    size_t mismatches = 0;
    Matches matches;
    std::string text;
    for (char32_t cp = 0; cp < 0x110000; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      text.clear();
      append_utf8(cp, text);
      matches.clear();
      regex.find_all(text, matches);
      bool matched = !matches.empty() && matches[0] == Regex::Match{0, text.size()};
      if (matched != ((char_class(cp) & bit) != 0) && ++mismatches <= 5) {
        ADD_FAILURE() << pattern << " U+" << std::hex << static_cast<uint32_t>(cp) << " regex says " << matched;
      }
    }
    EXPECT_EQ(mismatches, 0u) << pattern;
  }
}

TEST(TokenizerRegex, BadPatternsNameTheLocation) {
  EXPECT_THROW_WITH(Regex("a(b", "tok/tokenizer.json: pre_tokenizer.pattern"), core::Unsupported,
                    "tok/tokenizer.json: pre_tokenizer.pattern: Oniguruma cannot compile regex 'a(b'");
  EXPECT_THROW_WITH(split(split_spec({{"Regex", "a"}}, "Sideways", false), "a"), core::FormatError,
                    "test: key 'behavior' must be");
  EXPECT_THROW_WITH(split(split_spec({{"Other", "a"}}, "Isolated", false), "a"), core::FormatError,
                    "test.pattern: expected a 'Regex' or 'String' key");
}

TEST(TokenizerRegex, OneRegexSearchedFromManyThreads) {
  Regex regex(kQwen2Pattern, "test");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "It's 42 \xC3\xA9t\xC3\xA9s,  caf\xC3\xA9\n\n \xE4\xB8\xAD\xE6\x96\x87 ";
  Matches expected = find_all(regex, text);
  ASSERT_GT(expected.size(), 1000u);
  std::vector<size_t> mismatches(8, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < mismatches.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        if (find_all(regex, text) != expected) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (size_t t = 0; t < mismatches.size(); ++t) EXPECT_EQ(mismatches[t], 0u) << "thread " << t;
}

}  // namespace
}  // namespace tokenizer
}  // namespace dschat
