// Tokenizer behaviour that needs no Python: loading errors, batching, decoding and the GPT-2
// assets. Parity with Hugging Face is in tokenizer_parity_test.cpp.

#include "dschat/tokenizer/tokenizer.h"

#include <fstream>

#include "dschat/core/error.h"
#include "test_util.h"

namespace dschat {
namespace tokenizer {
namespace {

using testing::TempDir;

void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::filesystem::path gpt2_dir() { return testing::source_dir() / "assets/gpt2-bpe"; }

// A byte-level BPE small enough to reason about: "ab" and "Ġa" merge; <s> A </s> template.
const char kTokenizerTinyJson[] = R"({
  "version": "1.0",
  "added_tokens": [
    {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "<pad>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
  ],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
               {"SpecialToken": {"id": "</s>", "type_id": 0}}],
    "pair": [],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                       "</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}},
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "vocab": {"<s>": 0, "</s>": 1, "<pad>": 2, "a": 3, "b": 4, "c": 5, "\u0120": 6, "ab": 7, "\u0120a": 8},
            "merges": ["a b", "\u0120 a"]}
})";

class TokenizerTiny : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(dir_ / "tokenizer.json", kTokenizerTinyJson);
    write_file(dir_ / "tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})");
  }
  Tokenizer load() { return Tokenizer::load(dir_.path()); }
  TempDir dir_;
};

TEST_F(TokenizerTiny, EncodesWithTemplateAndMerges) {
  Tokenizer tok = load();
  EXPECT_EQ(tok.encode("ab a"), (std::vector<int64_t>{0, 7, 8, 1}));
  EXPECT_EQ(tok.encode("ab a", false), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(tok.encode("b c", false), (std::vector<int64_t>{4, 6, 5}));
  EXPECT_EQ(tok.encode("", true), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(tok.encode("a<pad>b", false), (std::vector<int64_t>{3, 2, 4}));
  EXPECT_EQ(tok.bos_token_id(), 0);
  EXPECT_EQ(tok.eos_token_id(), 1);
  EXPECT_EQ(tok.pad_token_id(), 2);
  EXPECT_EQ(tok.unk_token_id(), std::nullopt);
  EXPECT_EQ(tok.vocab_size(), 9);
}

TEST_F(TokenizerTiny, DecodesAndSkipsSpecialAndUnknownIds) {
  Tokenizer tok = load();
  EXPECT_EQ(tok.decode({0, 7, 8, 1}), "<s>ab a</s>");
  EXPECT_EQ(tok.decode({0, 7, 8, 1}, true), "ab a");
  EXPECT_EQ(tok.decode({7, 999, -1, 8}), "ab a") << "ids without a token are skipped";
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_FALSE(tok.is_special(7));
  EXPECT_EQ(tok.id_to_token(8), "\xC4\xA0" "a");
  EXPECT_EQ(tok.token_to_id("</s>"), 1);
  EXPECT_EQ(tok.token_to_id("zzz"), std::nullopt);
}

TEST_F(TokenizerTiny, BatchPadsRightOrLeftWithAttentionMask) {
  Tokenizer tok = load();
  BatchEncoding right = tok.encode_batch({"ab a", "c"});
  EXPECT_EQ(right.input_ids, (std::vector<std::vector<int64_t>>{{0, 7, 8, 1}, {0, 5, 1, 2}}));
  EXPECT_EQ(right.attention_mask, (std::vector<std::vector<int64_t>>{{1, 1, 1, 1}, {1, 1, 1, 0}}));

  BatchOptions left;
  left.padding_side = Side::kLeft;
  BatchEncoding padded = tok.encode_batch({"ab a", "c"}, left);
  EXPECT_EQ(padded.input_ids, (std::vector<std::vector<int64_t>>{{0, 7, 8, 1}, {2, 0, 5, 1}}));
  EXPECT_EQ(padded.attention_mask, (std::vector<std::vector<int64_t>>{{1, 1, 1, 1}, {0, 1, 1, 1}}));
}

TEST_F(TokenizerTiny, BatchTruncatesContentAndKeepsSpecialTokens) {
  Tokenizer tok = load();
  BatchOptions options;
  options.truncation = true;
  options.max_length = 3;
  // "ab a c" -> content [7, 8, 6, 5]; 3 - 2 special tokens leave one content token.
  EXPECT_EQ(tok.encode_batch({"ab a c"}, options).input_ids[0], (std::vector<int64_t>{0, 7, 1}));
  options.truncation_side = Side::kLeft;
  EXPECT_EQ(tok.encode_batch({"ab a c"}, options).input_ids[0], (std::vector<int64_t>{0, 5, 1}));
  options.add_special_tokens = false;
  EXPECT_EQ(tok.encode_batch({"ab a c"}, options).input_ids[0], (std::vector<int64_t>{8, 6, 5}));

  BatchOptions too_short;
  too_short.truncation = true;
  too_short.max_length = 1;
  EXPECT_THROW_WITH(tok.encode_batch({"a"}, too_short), core::InvalidArgument, "cannot hold the 2 special tokens");
  BatchOptions no_length;
  no_length.truncation = true;
  EXPECT_THROW_WITH(tok.encode_batch({"a"}, no_length), core::InvalidArgument, "max_length");
}

TEST_F(TokenizerTiny, BatchPaddingModes) {
  Tokenizer tok = load();
  BatchOptions multiple;
  multiple.pad_to_multiple_of = 8;
  BatchEncoding a = tok.encode_batch({"ab a", "c"}, multiple);
  EXPECT_EQ(a.input_ids[0], (std::vector<int64_t>{0, 7, 8, 1, 2, 2, 2, 2}));
  EXPECT_EQ(a.attention_mask[1], (std::vector<int64_t>{1, 1, 1, 0, 0, 0, 0, 0}));

  BatchOptions max_length;
  max_length.padding = Padding::kMaxLength;
  max_length.max_length = 6;
  max_length.pad_token_id = 5;
  EXPECT_EQ(tok.encode_batch({"c"}, max_length).input_ids[0], (std::vector<int64_t>{0, 5, 1, 5, 5, 5}));

  BatchOptions none;
  none.padding = Padding::kNone;
  BatchEncoding ragged = tok.encode_batch({"ab a", "c"}, none);
  EXPECT_EQ(ragged.input_ids[1], (std::vector<int64_t>{0, 5, 1}));
  EXPECT_EQ(ragged.attention_mask[1], (std::vector<int64_t>{1, 1, 1}));
  EXPECT_TRUE(tok.encode_batch({}).input_ids.empty());
}

TEST(TokenizerGpt2, AssetsLoadWithGpt2TokenizerDefaults) {
  Tokenizer tok = Tokenizer::load(gpt2_dir());
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<int64_t>{15496, 995}));
  EXPECT_EQ(tok.encode(" Hello world"), (std::vector<int64_t>{18435, 995}));
  EXPECT_EQ(tok.encode("a<|endoftext|>b"), (std::vector<int64_t>{64, 50256, 65}));
  EXPECT_EQ(tok.token_to_id("\xC4\xA0the"), 262);  // "Ġthe"
  EXPECT_EQ(tok.id_to_token(50256), "<|endoftext|>");
  EXPECT_EQ(tok.bos_token_id(), 50256);
  EXPECT_EQ(tok.eos_token_id(), 50256);
  EXPECT_EQ(tok.unk_token_id(), 50256);
  EXPECT_EQ(tok.pad_token_id(), std::nullopt);
  EXPECT_TRUE(tok.is_special(50256));
  EXPECT_EQ(tok.decode({15496, 50256, 995}, true), "Hello world");
}

TEST(TokenizerGpt2, InvalidUtf8IsEncodedAsReplacementCharacters) {
  Tokenizer tok = Tokenizer::load(gpt2_dir());
  EXPECT_EQ(tok.encode("a\xFF" "b"), tok.encode("a\xEF\xBF\xBD" "b"));
  // C0 80 is two ill-formed bytes; a truncated E2 82 is one maximal subpart.
  EXPECT_EQ(tok.encode("\xC0\x80"), tok.encode("\xEF\xBF\xBD\xEF\xBF\xBD"));
  EXPECT_EQ(tok.encode("x\xE2\x82"), tok.encode("x\xEF\xBF\xBD"));
  // A lone byte token of a multi-byte character decodes to U+FFFD.
  auto e4 = tok.token_to_id("\xC3\xA4");  // byte 0xE4 is shown as U+00E4
  ASSERT_TRUE(e4.has_value());
  EXPECT_EQ(tok.decode({*e4}), "\xEF\xBF\xBD");
}

TEST(TokenizerGpt2, PaddingWithoutPadTokenNeedsPadTokenId) {
  Tokenizer tok = Tokenizer::load(gpt2_dir());
  EXPECT_THROW_WITH(tok.encode_batch({"a", "a b c"}), core::InvalidArgument, "pad_token_id");
  BatchOptions options;
  options.pad_token_id = 50256;
  BatchEncoding batch = tok.encode_batch({"a", "a b c"}, options);
  EXPECT_EQ(batch.input_ids[0], (std::vector<int64_t>{64, 50256, 50256}));
  EXPECT_EQ(batch.attention_mask[0], (std::vector<int64_t>{1, 0, 0}));
}

TEST(TokenizerFiles, MissingDirectoryOrFilesAreNotFound) {
  EXPECT_THROW_WITH(Tokenizer::load("/nonexistent/tok"), core::NotFound, "/nonexistent/tok");
  TempDir dir;
  EXPECT_THROW_WITH(Tokenizer::load(dir.path()), core::NotFound, "tokenizer.json");
}

void expect_load_error_with_tokenizer_json(const std::string& from, const std::string& to, const char* fragment) {
  TempDir dir;
  std::string json = kTokenizerTinyJson;
  size_t at = json.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  json.replace(at, from.size(), to);
  write_file(dir / "tokenizer.json", json);
  try {
    Tokenizer::load(dir.path());
    ADD_FAILURE() << "expected an error containing '" << fragment << "'";
  } catch (const core::Error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
    EXPECT_NE(message.find("tokenizer.json"), std::string::npos) << message;
  }
}

TEST(TokenizerFiles, UnsupportedComponentsNameFileAndType) {
  expect_load_error_with_tokenizer_json(R"("type": "BPE")", R"("type": "WordPiece")", "model type 'WordPiece'");
  expect_load_error_with_tokenizer_json(R"("normalizer": null)", R"("normalizer": {"type": "BertNormalizer"})",
                                        "normalizer: unsupported normalizer type 'BertNormalizer'");
  expect_load_error_with_tokenizer_json(R"("decoder": {"type": "ByteLevel"})", R"("decoder": {"type": "CTC"})",
                                        "decoder type 'CTC'");
  expect_load_error_with_tokenizer_json(
      R"("decoder": {"type": "ByteLevel"})", R"("decoder": {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "})",
      "decoder.pattern: unsupported Regex pattern");
  expect_load_error_with_tokenizer_json(R"("dropout": null)", R"("dropout": 0.1)", "dropout");
  expect_load_error_with_tokenizer_json(R"("pre_tokenizer": {"type": "ByteLevel")",
                                        R"("pre_tokenizer": {"type": "BertPreTokenizer")",
                                        "pre_tokenizer: unsupported pre_tokenizer type 'BertPreTokenizer'");
  expect_load_error_with_tokenizer_json(
      R"("pre_tokenizer": {"type": "ByteLevel")",
      R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "UnicodeScripts"}]}, "x": {"type": "ByteLevel")",
      "pre_tokenizer.pretokenizers[0]: unsupported pre_tokenizer type 'UnicodeScripts'");
}

TEST(TokenizerFiles, BadRegexNamesFileComponentAndPattern) {
  // An unterminated group: Oniguruma's own message follows the location and the pattern.
  expect_load_error_with_tokenizer_json(
      R"("pre_tokenizer": {"type": "ByteLevel")",
      R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "a(b"}, "behavior": "Isolated", "invert": false}]}, "x": {"type": "ByteLevel")",
      "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern: Oniguruma cannot compile regex 'a(b': end pattern with unmatched parenthesis");
  expect_load_error_with_tokenizer_json(
      R"("normalizer": null)", R"("normalizer": {"type": "Replace", "pattern": {"Regex": "\\p{NoSuchProperty}"}, "content": ""})",
      "normalizer.pattern: Oniguruma cannot compile regex");
  expect_load_error_with_tokenizer_json(
      R"("pre_tokenizer": {"type": "ByteLevel")",
      R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Dropped", "invert": false}, "x": {"type": "ByteLevel")",
      "pre_tokenizer: key 'behavior' must be Removed, Isolated");
}

TEST(TokenizerFiles, MalformedFilesAreFormatErrors) {
  expect_load_error_with_tokenizer_json(R"("a b", "\u0120 a")", R"("a b", "a z")", "'z' is not in the vocabulary");
  expect_load_error_with_tokenizer_json(R"("a b", "\u0120 a")", R"("a b c")", "two tokens separated by one space");
  expect_load_error_with_tokenizer_json(R"("a": 3,)", R"("a": "three",)", "vocab token 'a'");
  TempDir dir;
  write_file(dir / "vocab.json", R"({"a": 0, "b": 1})");
  write_file(dir / "merges.txt", "#version: 0.2\na b\n");
  EXPECT_THROW_WITH(Tokenizer::load(dir.path()), core::FormatError, "merged token 'ab' is not in the vocabulary");
}

}  // namespace
}  // namespace tokenizer
}  // namespace dschat
