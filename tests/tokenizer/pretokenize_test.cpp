// GPT-2 pre-tokenisation, UTF-8 repair and the Unicode classes against `tokenizers`.

#include <fstream>
#include <iterator>

#include "test_util.h"
#include "tokenizer/pretokenize_gpt2.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<Span> spans;
  split_gpt2(text, spans);
  std::vector<std::string> out;
  for (auto [begin, end] : spans) out.push_back(text.substr(begin, end - begin));
  return out;
}

using Words = std::vector<std::string>;

TEST(PreTokenizeGpt2, LettersNumbersAndSymbolsTakeOneLeadingSpace) {
  EXPECT_EQ(split("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split("abc123def"), (Words{"abc", "123", "def"}));
  EXPECT_EQ(split(" 123 ..."), (Words{" 123", " ..."}));
  EXPECT_EQ(split("\xC3\xA9t\xC3\xA9 \xD0\xBC\xD0\xB8\xD1\x80"), (Words{"\xC3\xA9t\xC3\xA9", " \xD0\xBC\xD0\xB8\xD1\x80"}));
  EXPECT_EQ(split(""), Words{});
}

TEST(PreTokenizeGpt2, ContractionsAreLowercaseOnly) {
  EXPECT_EQ(split("I'm"), (Words{"I", "'m"}));
  EXPECT_EQ(split("I'M"), (Words{"I", "'", "M"}));
  EXPECT_EQ(split("they'll've"), (Words{"they", "'ll", "'ve"}));
  EXPECT_EQ(split("'sa"), (Words{"'s", "a"}));
  EXPECT_EQ(split("x'Re"), (Words{"x", "'", "Re"}));
  EXPECT_EQ(split("\xE2\x80\x99s"), (Words{"\xE2\x80\x99", "s"}));  // U+2019 is not an apostrophe here
}

TEST(PreTokenizeGpt2, WhitespaceRunsLeaveTheLastSpaceToTheNextWord) {
  EXPECT_EQ(split("a   b"), (Words{"a", "  ", " b"}));
  EXPECT_EQ(split("a \n b"), (Words{"a", " \n", " b"}));
  EXPECT_EQ(split("a\n\nb"), (Words{"a", "\n", "\n", "b"}));
  EXPECT_EQ(split("a  "), (Words{"a", "  "}));
  EXPECT_EQ(split("\tx"), (Words{"\t", "x"}));
  // U+00A0 and U+3000 are \s but only U+0020 joins the next word.
  EXPECT_EQ(split("x\xC2\xA0y"), (Words{"x", "\xC2\xA0", "y"}));
  EXPECT_EQ(split("x \xE3\x80\x80y"), (Words{"x", " ", "\xE3\x80\x80", "y"}));
  // U+200B is not White_Space: it is a symbol.
  EXPECT_EQ(split("a\xE2\x80\x8B" "b"), (Words{"a", "\xE2\x80\x8B", "b"}));
}

TEST(PreTokenizeUtf8, ReplacesMaximalIllFormedSubparts) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(to_valid_utf8("plain \xC3\xA9"), "plain \xC3\xA9");
  EXPECT_EQ(to_valid_utf8("\xC0\x80"), fffd + fffd);
  EXPECT_EQ(to_valid_utf8("\xE0\xA0"), fffd);
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), fffd + fffd + fffd);  // a surrogate
  EXPECT_EQ(to_valid_utf8("a\xF0\x9F\x98" "b"), "a" + fffd + "b");
  EXPECT_EQ(to_valid_utf8("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ok\xFF"), 2u);
  EXPECT_EQ(find_invalid_utf8("ok"), std::string::npos);
}

TEST(PreTokenizeUnicode, ClassesOfSampleCodePoints) {
  EXPECT_EQ(char_class(U'a') & (kLetter | kNumber | kSpace), kLetter);
  EXPECT_EQ(char_class(0x0660) & kNumber, kNumber);  // Arabic-Indic zero
  EXPECT_EQ(char_class(0x2167) & kNumber, kNumber);  // Roman numeral eight (Nl)
  EXPECT_EQ(char_class(0x0085) & kSpace, kSpace);
  EXPECT_EQ(char_class(0x200B) & kSpace, 0);
  EXPECT_EQ(char_class(0x0301) & (kLetter | kWord), kWord);  // a combining mark is \w, not \p{L}
  EXPECT_EQ(char_class(0x105C0) & kLetter, kLetter);         // Todhri, Unicode 16.0
}

// Compares all 1,112,064 code points with the classes `tokenizers` uses (about 35 s in Python).
TEST(UnicodeClassSlow, EveryCodePointMatchesTokenizers) {
  testing::TempDir dir;
  std::string output;
  int status = testing::run_command(std::string(DSCHAT_PYTHON) + " " +
                                        (testing::source_dir() / "tests/tokenizer/classify_hf.py").string() + " " +
                                        (dir / "classes.bin").string(),
                                    &output);
  ASSERT_EQ(status, 0) << output;
  std::ifstream in(dir / "classes.bin", std::ios::binary);
  std::vector<char> expected((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(expected.size(), 0x110000u);
  size_t mismatches = 0;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    uint8_t bits = char_class(cp);
    int mine = (bits & kLetter) ? 1 : (bits & kNumber) ? 2 : (bits & kSpace) ? 0 : 3;
    if (mine != expected[cp] && ++mismatches <= 10) {
      ADD_FAILURE() << "U+" << std::hex << static_cast<uint32_t>(cp) << ": dschat class " << mine
                    << ", tokenizers class " << static_cast<int>(expected[cp]);
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

}  // namespace
}  // namespace tokenizer
}  // namespace dschat
