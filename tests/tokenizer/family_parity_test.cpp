// Parity with Hugging Face `tokenizers` for the families whose tokenizer.json splits with a regex
// (Qwen2/2.5/3, LLaMA-3, BLOOM), GPT-NeoX, Falcon, and the Lowercase, Digits and regex Replace
// components: tests/tokenizer/make_family_cases.py builds their pipelines around GPT-2's vocabulary and
// writes what `tokenizers` computes. Also: every Split behavior with and without invert, and the
// Lowercase, NFC/NFD/NFKC/NFKD, Whitespace and Punctuation of every code point.

#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "dschat/tokenizer/tokenizer.h"
#include "test_util.h"
#include "tokenizer/json_spec.h"
#include "tokenizer/lowercase.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/parity_cases.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

using parity::CaseSet;

class FamilyParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { run_.start("make_family_cases.py"); }
  static void TearDownTestSuite() { run_.stop(); }
  const CaseSet& set(const std::string& name) { return run_.set(name); }
  static std::filesystem::path out() { return run_.out(); }

  static parity::OracleRun run_;
};

parity::OracleRun FamilyParity::run_;

TEST_F(FamilyParity, Qwen2SplitRegexMatchesTokenizers) { parity::check_set(set("qwen2"), 1900); }

TEST_F(FamilyParity, Llama3SplitRegexMatchesTokenizers) { parity::check_set(set("llama3"), 1900); }

TEST_F(FamilyParity, BloomSplitRegexMatchesTokenizers) { parity::check_set(set("bloom"), 1900); }

TEST_F(FamilyParity, GptNeoxNfcByteLevelMatchesTokenizers) { parity::check_set(set("neox"), 1900); }

TEST_F(FamilyParity, FalconPunctuationDigitsMatchTokenizers) { parity::check_set(set("falcon"), 1900); }

TEST_F(FamilyParity, LowercaseDigitsAndSplitVariantsMatchTokenizers) { parity::check_set(set("mixed"), 1900); }

TEST_F(FamilyParity, Llama3AndBloomDecodeRoundTrips) {
  parity::check_round_trip(set("llama3"), 1000);
  parity::check_round_trip(set("bloom"), 1000);
}

TEST_F(FamilyParity, Llama3PrependsBeginOfText) {
  const CaseSet& cases = set("llama3");
  if (cases.lines.empty()) return;
  Tokenizer tok = Tokenizer::load(cases.dir);
  std::vector<int64_t> ids = tok.encode("1234567", true);
  ASSERT_GE(ids.size(), 4u);  // <|begin_of_text|> 123 456 7: \p{N}{1,3} splits the digits
  EXPECT_EQ(ids[0], *tok.token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(tok.decode(ids, true), "1234567");
}

TEST_F(FamilyParity, SplitBehaviorsDigitsWhitespaceSplitAndNormalizersMatchTokenizers) {
  EXPECT_EQ(run_.status(), 0) << run_.output();
  std::ifstream in(out() / "split_cases.jsonl");
  std::string text;
  size_t compared = 0, mismatches = 0;
  while (std::getline(in, text)) {
    nlohmann::json line = nlohmann::json::parse(text);
    ++compared;
    std::vector<std::string> got;
    std::vector<std::string> expected;
    if (line.contains("pre_tokenizer")) {
      std::vector<Piece> pieces{Piece{line["text"], true}};
      make_pre_tokenizer(JsonSpec(line["pre_tokenizer"], "case"))->pre_tokenize(pieces);
      for (const Piece& piece : pieces) got.push_back(piece.text);
      expected = line["pieces"].get<std::vector<std::string>>();
    } else {
      std::string normalized = line["text"];
      make_normalizer(JsonSpec(line["normalizer"], "case"))->normalize(normalized);
      got = {normalized};
      expected = {line["normalized"].get<std::string>()};
    }
    if (got != expected && ++mismatches <= 10) {
      ADD_FAILURE() << text << "\n  got " << nlohmann::json(got).dump();
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(compared, 3000u);  // 15 patterns x 5 behaviors x 2 inverts x 20 texts, and more
}

TEST_F(FamilyParity, LowercaseOfEveryCodePointMatchesTokenizers) {
  EXPECT_EQ(run_.status(), 0) << run_.output();
  // lowercase.tsv: "hex<TAB>hex hex..." for each code point that `tokenizers` changes.
  std::unordered_map<char32_t, std::string> changed;
  std::ifstream in(out() / "lowercase.tsv");
  std::string line;
  while (std::getline(in, line)) {
    size_t tab = line.find('\t');
    std::istringstream targets(line.substr(tab + 1));
    std::string hex, lowered;
    while (targets >> hex) append_utf8(static_cast<char32_t>(std::stoul(hex, nullptr, 16)), lowered);
    changed[static_cast<char32_t>(std::stoul(line.substr(0, tab), nullptr, 16))] = lowered;
  }
  ASSERT_GT(changed.size(), 1400u);
  size_t mismatches = 0;
  for (char32_t cp = 1; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string text;
    append_utf8(cp, text);
    auto it = changed.find(cp);
    std::string expected = it == changed.end() ? text : it->second;
    lowercase_utf8(text);
    if (text != expected && ++mismatches <= 10) {
      ADD_FAILURE() << "U+" << std::hex << static_cast<uint32_t>(cp) << ": got " << nlohmann::json(text).dump()
                    << ", tokenizers " << nlohmann::json(expected).dump();
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST_F(FamilyParity, UnicodeFormsOfEveryCodePointMatchTokenizers) {
  EXPECT_EQ(run_.status(), 0) << run_.output();
  // normalized.tsv: "FORM<TAB>hex<TAB>hex hex..." for each code point a form changes.
  std::map<std::string, std::unordered_map<char32_t, std::string>> changed;
  std::ifstream in(out() / "normalized.tsv");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string form, from, hex, normalized;
    fields >> form >> from;
    while (fields >> hex) append_utf8(static_cast<char32_t>(std::stoul(hex, nullptr, 16)), normalized);
    changed[form][static_cast<char32_t>(std::stoul(from, nullptr, 16))] = normalized;
  }
  ASSERT_EQ(changed.size(), 4u);
  for (const auto& [form, table] : changed) {
    auto normalizer = make_normalizer(JsonSpec(nlohmann::json{{"type", form}}, "test"));
    size_t mismatches = 0;
    for (char32_t cp = 1; cp < 0x110000; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      std::string text;
      append_utf8(cp, text);
      auto it = table.find(cp);
      std::string expected = it == table.end() ? text : it->second;
      normalizer->normalize(text);
      if (text != expected && ++mismatches <= 5) {
        ADD_FAILURE() << form << " of U+" << std::hex << static_cast<uint32_t>(cp) << ": got "
                      << nlohmann::json(text).dump() << ", tokenizers " << nlohmann::json(expected).dump();
      }
    }
    EXPECT_EQ(mismatches, 0u) << form;
  }
}

TEST_F(FamilyParity, WhitespaceAndPunctuationOfEveryCodePointMatchTokenizers) {
  EXPECT_EQ(run_.status(), 0) << run_.output();
  // Two bytes per code point c: Whitespace on "a" + c gives w (one word), s (c removed) or o
  // (c apart); Punctuation gives p (c isolated) or n.
  std::ifstream in(out() / "pre_tokenizer_classes.bin", std::ios::binary);
  std::vector<char> expected((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(expected.size(), 2 * 0x110000u);
  auto whitespace = make_pre_tokenizer(JsonSpec(nlohmann::json{{"type", "Whitespace"}}, "test"));
  auto punctuation = make_pre_tokenizer(JsonSpec(nlohmann::json{{"type", "Punctuation"}, {"behavior", "Isolated"}}, "test"));
  size_t mismatches = 0;
  std::vector<Piece> pieces;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string text = "a";
    append_utf8(cp, text);
    pieces.assign(1, Piece{text, true});
    whitespace->pre_tokenize(pieces);
    char word = pieces.size() == 1 && pieces[0].text == text ? 'w' : pieces.size() == 1 ? 's' : 'o';
    pieces.assign(1, Piece{text, true});
    punctuation->pre_tokenize(pieces);
    char punct = pieces.size() == 2 ? 'p' : 'n';
    if ((word != expected[2 * cp] || punct != expected[2 * cp + 1]) && ++mismatches <= 10) {
      ADD_FAILURE() << "U+" << std::hex << static_cast<uint32_t>(cp) << ": dschat " << word << punct << ", tokenizers "
                    << expected[2 * cp] << expected[2 * cp + 1];
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST_F(FamilyParity, ConcurrentEncodeEqualsSingleThreaded) {
  // One regex object shared by all threads, each with its own Oniguruma region.
  const CaseSet& cases = set("qwen2");
  if (cases.lines.empty()) return;
  std::vector<std::string> texts;
  for (const nlohmann::json& line : cases.lines) {
    if (line.contains("text")) texts.push_back(line["text"]);
  }
  Tokenizer tok = Tokenizer::load(cases.dir);
  std::vector<std::vector<int64_t>> expected;
  for (const std::string& text : texts) expected.push_back(tok.encode(text));

  Tokenizer shared = Tokenizer::load(cases.dir);
  constexpr size_t kThreads = 8;
  std::vector<size_t> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < texts.size(); ++k) {
        size_t i = (k * 7 + t * 311) % texts.size();
        if (shared.encode(texts[i]) != expected[i]) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (size_t t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0u) << "thread " << t;
}

}  // namespace
}  // namespace tokenizer
}  // namespace dschat
