// Parity with Hugging Face: tests/tokenizer/make_tokenizer_cases.py writes cases computed with
// `tokenizers`/`transformers` (GPT-2 from assets/gpt2-bpe, an OPT-style directory, added-token
// flags, three LLaMA-style byte-fallback tokenizers), and every id and decoded text must match.
// The regex-split families (Qwen2, LLaMA-3, BLOOM, GPT-NeoX) are in family_parity_test.cpp.

#include <nlohmann/json.hpp>

#include <memory>
#include <thread>

#include "dschat/tokenizer/tokenizer.h"
#include "test_util.h"
#include "tokenizer/parity_cases.h"

namespace dschat {
namespace tokenizer {
namespace {

using parity::CaseSet;

class TokenizerParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { run_.start("make_tokenizer_cases.py"); }
  static void TearDownTestSuite() { run_.stop(); }
  const CaseSet& set(const std::string& name) { return run_.set(name); }

  // Compares every line of `name`; returns the number of encoded strings compared.
  size_t check_set(const std::string& name, size_t min_cases) { return parity::check_set(set(name), min_cases); }

  static parity::OracleRun run_;
};

parity::OracleRun TokenizerParity::run_;

TEST_F(TokenizerParity, Gpt2MatchesTransformersOnTenThousandStrings) { check_set("gpt2", 10000); }

TEST_F(TokenizerParity, Gpt2InvalidUtf8AndRandomIdsMatch) { check_set("gpt2_bytes", 400); }

TEST_F(TokenizerParity, Gpt2DecodeRoundTripsValidUtf8) { parity::check_round_trip(set("gpt2"), 10000); }

TEST_F(TokenizerParity, OptStyleDirectoryMatchesAutoTokenizer) {
  check_set("opt", 1000);
  const CaseSet& cases = set("opt");
  if (cases.lines.empty()) return;
  const nlohmann::json& meta = cases.lines.back();
  Tokenizer tok = Tokenizer::load(cases.dir);
  EXPECT_EQ(tok.bos_token_id(), meta["bos"].get<int64_t>());
  EXPECT_EQ(tok.eos_token_id(), meta["eos"].get<int64_t>());
  EXPECT_EQ(tok.pad_token_id(), meta["pad"].get<int64_t>());
  EXPECT_EQ(tok.unk_token_id(), meta["unk"].get<int64_t>());
  EXPECT_EQ(tok.vocab_size(), meta["vocab_size"].get<int64_t>());
  EXPECT_EQ(tok.encode("Hello", true).front(), meta["bos"].get<int64_t>()) << "OPT prepends </s> as bos";
}

TEST_F(TokenizerParity, AddedTokenFlagsMatchTokenizers) { check_set("gpt2_flags", 2000); }

TEST_F(TokenizerParity, LlamaLegacyNormalizerMatchesTokenizers) { check_set("llama_legacy", 1400); }

TEST_F(TokenizerParity, LlamaMetaspaceFirstMatchesTokenizers) { check_set("llama_metaspace", 1400); }

TEST_F(TokenizerParity, LlamaMetaspaceSplitNfkcMatchesTokenizers) { check_set("llama_split", 1400); }

TEST_F(TokenizerParity, LlamaFallsBackToByteTokens) {
  const CaseSet& cases = set("llama_legacy");
  if (cases.lines.empty()) return;
  Tokenizer tok = Tokenizer::load(cases.dir);
  // U+4E2D is outside the small trained vocabulary: its UTF-8 bytes E4 B8 AD become <0x..> tokens.
  std::vector<int64_t> ids = tok.encode("\xE4\xB8\xAD", false);
  std::vector<int64_t> bytes = {*tok.token_to_id("<0xE4>"), *tok.token_to_id("<0xB8>"), *tok.token_to_id("<0xAD>")};
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(std::vector<int64_t>(ids.end() - 3, ids.end()), bytes);
  EXPECT_EQ(tok.decode(ids), "\xE4\xB8\xAD");
}

TEST_F(TokenizerParity, ConcurrentEncodeEqualsSingleThreaded) {
  const CaseSet& cases = set("gpt2");
  if (cases.lines.empty()) return;
  Tokenizer tok = Tokenizer::load(cases.dir);
  std::vector<std::string> texts;
  for (const nlohmann::json& line : cases.lines) texts.push_back(line["text"]);
  std::vector<std::vector<int64_t>> expected;
  for (const std::string& text : texts) expected.push_back(tok.encode(text));

  // A fresh tokenizer so the threads fill its word cache while they race.
  Tokenizer shared = Tokenizer::load(cases.dir);
  constexpr size_t kThreads = 8;
  std::vector<size_t> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < texts.size(); ++k) {
        size_t i = (k * 7 + t * 1311) % texts.size();  // each thread walks the texts in its own order
        if (shared.encode(texts[i]) != expected[i]) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (size_t t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0u) << "thread " << t;

  BatchOptions options;
  options.padding = Padding::kNone;
  options.num_threads = 4;
  BatchEncoding batch = shared.encode_batch(texts, options);
  EXPECT_EQ(batch.input_ids, expected);
}

}  // namespace
}  // namespace tokenizer
}  // namespace dschat
