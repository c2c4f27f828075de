// create_prompt_dataset against a Python reference that builds the phase data the way
// DeepSpeed-Chat does (tests/data/deepspeed_chat_data_oracle.py, through transformers and numpy),
// plus the content-keyed cache, the memory mapping and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dschat/data/collate.h"
#include "dschat/data/prompt_dataset.h"
#include "dschat/data/split.h"
#include "dschat/tokenizer/tokenizer.h"
#include "dstok_writer.h"
#include "test_util.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// facebook/opt-*'s tokenizer files over GPT-2's vocabulary: "</s>" is bos = eos and is prepended.
fs::path make_opt_tokenizer(const fs::path& dir) {
  fs::create_directories(dir);
  for (const char* name : {"vocab.json", "merges.txt"}) fs::copy_file(testing::source_dir() / "assets/gpt2-bpe" / name, dir / name);
  auto token = [](const char* s) { return json{{"content", s}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                                               {"normalized", true}, {"__type", "AddedToken"}}; };
  std::ofstream(dir / "tokenizer_config.json") << json{{"unk_token", token("</s>")}, {"bos_token", token("</s>")},
                                                       {"eos_token", token("</s>")}, {"pad_token", token("<pad>")},
                                                       {"add_prefix_space", false}, {"add_bos_token", true},
                                                       {"tokenizer_class", "GPT2Tokenizer"}}.dump();
  std::ofstream(dir / "special_tokens_map.json") << json{{"bos_token", token("</s>")}, {"eos_token", token("</s>")},
                                                         {"unk_token", token("</s>")}, {"pad_token", token("<pad>")}}.dump();
  return dir;
}

std::string words(int seed, int count) {
  static const char* kWords[] = {"apple", "river", "stone", "quick", "blue", "seven", "Über", "日本", "why", "hello"};
  std::string out;
  for (int i = 0; i < count; ++i) out += std::string(i ? " " : "") + kWords[(seed * 7 + i * 3) % 10];
  return out;
}

struct Fixture {
  testing::TempDir tmp;
  fs::path tokenizer_dir = make_opt_tokenizer(tmp / "tok");
  fs::path jsonfile = tmp / "jsonfile";
  fs::path synthetic = tmp / "Dahoas" / "synthetic-instruct-gptj-pairwise";
  fs::path rm_static = tmp / "Dahoas" / "rm-static";
  tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::load(tokenizer_dir);

  Fixture() {
    fs::create_directories(jsonfile);
    fs::create_directories(synthetic);
    fs::create_directories(rm_static);
    for (const char* split : {"train", "eval"}) {
      json rows = json::array();
      const int n = split == std::string("train") ? 31 : 11;
      for (int i = 0; i < n; ++i) {
        json row = {{"prompt", "Human: " + words(i, 2 + i % 9) + " Assistant:"}, {"chosen", words(i + 1, 1 + i % 13)},
                    {"rejected", words(i + 2, 1 + i % 5)}};
        if (i % 7 == 3) row["rejected"] = nullptr;  // SFT keeps it, the reward phase skips it
        rows.push_back(row);
      }
      std::ofstream(jsonfile / (std::string(split) + ".json")) << rows.dump(1);
    }
    std::ofstream syn(synthetic / "train.jsonl");
    for (int i = 0; i < 27; ++i) {
      syn << json{{"prompt", words(i + 3, 1 + i % 17)}, {"chosen", words(i, 3)}, {"rejected", words(i, 2)}}.dump() << "\n";
    }
    for (const char* split : {"train", "test"}) {
      std::ofstream out(rm_static / (std::string(split) + ".jsonl"));
      for (int i = 0; i < 9; ++i) {
        out << json{{"prompt", "\n\nHuman: " + words(i, 4) + "\n\nAssistant:"}, {"response", " ok"},
                    {"chosen", " " + words(i + 5, 3)}, {"rejected", " no"}}.dump() << "\n";
      }
    }
  }

  data::PromptDataOptions options(int phase) const {
    data::PromptDataOptions o;
    o.phase = phase;
    o.data_path = {{"local/jsonfile:" + jsonfile.string(), std::nullopt}, {synthetic.string(), std::nullopt}};
    o.data_split = "2,4,4";
    o.seed = 1234;
    o.max_seq_len = phase == 3 ? 12 : 16;  // small enough to truncate and to drop long prompts
    o.end_of_conversation_token = phase == 1 ? "</s>" : "<|endoftext|>";
    o.cache_dir = tmp / "cache";
    o.num_threads = 2;
    return o;
  }

  json oracle(const data::PromptDataOptions& o, const std::vector<std::string>& sft = {}) const {
    std::string command = std::string(DSCHAT_PYTHON) + " " +
                          (testing::source_dir() / "tests/data/deepspeed_chat_data_oracle.py").string() +
                          " --tokenizer " + tokenizer_dir.string() + " --phase " + std::to_string(o.phase) +
                          " --split " + o.data_split + " --seed " + std::to_string(o.seed) + " --max-seq-len " +
                          std::to_string(o.max_seq_len) + " --eot '" + o.end_of_conversation_token + "'";
    for (const auto& spec : o.data_path) {
      const bool jf = spec.name.rfind("local/jsonfile:", 0) == 0;
      command += " --data " + std::string(jf ? "jsonfile:" + jsonfile.string() : "synthetic:" + spec.name);
    }
    for (const auto& s : sft) command += " --sft " + s;
    std::string output;
    const fs::path out_file = tmp / "oracle.json";
    EXPECT_EQ(testing::run_command(command + " --out " + out_file.string(), &output), 0) << output;
    std::ifstream in(out_file);
    return json::parse(in);
  }
};

json items_of(const data::TokenizedDataset& d) {
  json out = json::array();
  for (int64_t i = 0; i < d.size(); ++i) {
    auto ids = [&](int field) {
      auto span = d.sequence(i, field);
      return json(std::vector<int64_t>(span.begin(), span.end()));
    };
    out.push_back(d.fields() == 2 ? json::array({ids(0), ids(1)}) : ids(0));
  }
  return out;
}

TEST(PromptDataset, Phase1WithSftOnlyDataMatchesDeepSpeedChatSlow) {
  Fixture f;
  auto o = f.options(1);
  o.sft_only_data_path = {{f.rm_static.string(), std::nullopt}};
  auto data = data::create_prompt_dataset(o, f.tokenizer);
  json expected = f.oracle(o, {"hh:" + f.rm_static.string()});
  ASSERT_GE(data.train.size(), 15);
  EXPECT_EQ(items_of(data.train), expected["train"]);
  EXPECT_EQ(items_of(data.eval), expected["eval"]);
  // The prompt length marks where P ends inside PC: the first tokens of every row are the prompt's.
  for (int64_t i = 0; i < data.train.size(); ++i) {
    EXPECT_GT(data.train.prompt_length(i), 1);
    EXPECT_LE(data.train.prompt_length(i), data.train.sequence(i).size);
  }
}

TEST(PromptDataset, Phase2PairsMatchDeepSpeedChatSlow) {
  Fixture f;
  auto data = data::create_prompt_dataset(f.options(2), f.tokenizer);
  json expected = f.oracle(f.options(2));
  ASSERT_GT(data.train.size(), 5);
  EXPECT_EQ(items_of(data.train), expected["train"]);
  EXPECT_EQ(items_of(data.eval), expected["eval"]);
}

TEST(PromptDataset, Phase3PromptsMatchDeepSpeedChatAndLongOnesAreCountedSlow) {
  Fixture f;
  auto o = f.options(3);
  o.data_path.resize(1);
  o.data_path[0] = {f.synthetic.string(), std::nullopt};
  auto data = data::create_prompt_dataset(o, f.tokenizer);
  json expected = f.oracle(o);
  EXPECT_EQ(items_of(data.train), expected["train"]);
  EXPECT_EQ(items_of(data.eval), expected["eval"]);
  EXPECT_GT(data.stats["datasets"][0]["train"]["prompts_too_long"].get<int64_t>(), 0);
  EXPECT_EQ(data.stats["datasets"][0]["train"]["items"].get<int64_t>(), data.train.size());
}

TEST(PromptDataset, Phase2PairsKeepTheirPromptLength) {
  Fixture f;
  auto o = f.options(2);  // max_seq_len 16: some prompts of the slice fit, some are longer
  o.data_path.resize(1);  // local/jsonfile alone: no blending, items in phase-slice order
  auto data = data::create_prompt_dataset(o, f.tokenizer);

  data::RawDatasetOptions raw_options;
  raw_options.seed = o.seed;
  const data::DatasetFiles files = data::locate_dataset(o.data_path[0], raw_options);
  const data::RawDataset raw = data::load_raw_dataset(o.data_path[0], files, raw_options);
  tokenizer::BatchOptions truncating;
  truncating.padding = tokenizer::Padding::kNone;
  truncating.truncation = true;
  truncating.max_length = static_cast<size_t>(o.max_seq_len);
  int64_t whole = 0, capped = 0;
  auto check = [&](const std::vector<data::PromptRecord>& records, const data::TokenizedDataset& pairs) {
    // The phase's records as DeepSpeed-Chat takes them: its slice in permutation order, without
    // records that lack PC or PR.
    std::vector<const data::PromptRecord*> kept;
    for (int64_t index : data::phase_indices(o.data_split, 1, o.seed, static_cast<int64_t>(records.size()))) {
      if (records[index].prompt_and_chosen && records[index].prompt_and_rejected) kept.push_back(&records[index]);
    }
    ASSERT_EQ(static_cast<int64_t>(kept.size()), pairs.size());
    for (int64_t i = 0; i < pairs.size(); ++i) {
      // Item i is record kept[i]'s pair (the checks below rely on it).
      const auto chosen = f.tokenizer.encode_batch({*kept[i]->prompt_and_chosen + o.end_of_conversation_token},
                                                   truncating).input_ids[0];
      ASSERT_EQ(std::vector<int64_t>(pairs.sequence(i, 0).begin(), pairs.sequence(i, 0).end()), chosen) << i;
      const std::vector<int64_t> prompt = f.tokenizer.encode(*kept[i]->prompt);  // alone, untruncated
      if (static_cast<int64_t>(prompt.size()) > o.max_seq_len) {
        EXPECT_EQ(pairs.prompt_length(i), o.max_seq_len) << i;  // truncated like the rows
        ++capped;
        continue;
      }
      ++whole;
      EXPECT_EQ(pairs.prompt_length(i), static_cast<int32_t>(prompt.size())) << i;
      for (int field = 0; field < 2; ++field) {  // both rows start with exactly the prompt's tokens
        const data::TokenSpan row = pairs.sequence(i, field);
        ASSERT_GE(row.size, static_cast<int64_t>(prompt.size())) << i;
        EXPECT_EQ(std::vector<int64_t>(row.begin(), row.begin() + prompt.size()), prompt) << i << " field " << field;
      }
    }
  };
  check(raw.train, data.train);
  check(raw.eval, data.eval);
  EXPECT_GT(whole, 0);
  EXPECT_GT(capped, 0);

  // The batch carries them: [B], the value of each pair.
  const std::vector<int64_t> items = {2, 0, 1};
  auto batch = data::collate_reward(data.train, items, {0, std::nullopt});
  ASSERT_EQ(batch.prompt_lengths.dim(), 1);
  ASSERT_EQ(batch.prompt_lengths.size(0), 3);
  for (size_t k = 0; k < items.size(); ++k) {
    EXPECT_EQ(batch.prompt_lengths[k].item<int64_t>(), data.train.prompt_length(items[k]));
  }
  // The cache entry keeps them.
  auto cached = data::create_prompt_dataset(o, f.tokenizer);
  ASSERT_TRUE(cached.from_cache);
  for (int64_t i = 0; i < data.train.size(); ++i) {
    EXPECT_EQ(cached.train.prompt_length(i), data.train.prompt_length(i)) << i;
  }

  // Blended datasets keep each pair's own length: its rows share that many leading tokens.
  auto blended = data::create_prompt_dataset(f.options(2), f.tokenizer);
  for (int64_t i = 0; i < blended.train.size(); ++i) {
    const int32_t length = blended.train.prompt_length(i);
    EXPECT_GT(length, 1) << i;
    EXPECT_LE(length, 16) << i;
    const data::TokenSpan chosen = blended.train.sequence(i, 0), rejected = blended.train.sequence(i, 1);
    ASSERT_LE(length, std::min(chosen.size, rejected.size)) << i;
    EXPECT_TRUE(std::equal(chosen.begin(), chosen.begin() + length, rejected.begin())) << i;
  }
}

TEST(PromptDataset, Phase2CacheWithoutPromptLengthsIsRebuilt) {
  Fixture f;
  auto first = data::create_prompt_dataset(f.options(2), f.tokenizer);
  // Entries at this key as a build before prompt lengths wrote them (that build's key differed
  // too: kCacheFormatVersion went from 1 to 2, so such entries are normally never looked up).
  testing::write_dstok(first.train_file, first.train, 1);
  testing::write_dstok(first.eval_file, first.eval, 1);
  EXPECT_THROW_WITH(data::TokenizedDataset::load(first.train_file), core::FormatError, "version-1 reward file");
  auto rebuilt = data::create_prompt_dataset(f.options(2), f.tokenizer);
  EXPECT_FALSE(rebuilt.from_cache);
  EXPECT_EQ(items_of(rebuilt.train), items_of(first.train));
  for (int64_t i = 0; i < first.train.size(); ++i) {
    EXPECT_EQ(rebuilt.train.prompt_length(i), first.train.prompt_length(i)) << i;
  }
  auto again = data::create_prompt_dataset(f.options(2), f.tokenizer);
  EXPECT_TRUE(again.from_cache);  // the rebuilt entry is current
}

TEST(PromptDataset, CacheIsKeyedOnContentsAndMapped) {
  Fixture f;
  auto first = data::create_prompt_dataset(f.options(2), f.tokenizer);
  EXPECT_FALSE(first.from_cache);
  ASSERT_TRUE(fs::is_regular_file(first.train_file));
  auto again = data::create_prompt_dataset(f.options(2), f.tokenizer);
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.train_file, first.train_file);
  EXPECT_EQ(items_of(again.train), items_of(first.train));
  EXPECT_EQ(again.stats, first.stats);
  // The cached data is a mapping of the file, not a private copy.
  std::ifstream maps("/proc/self/maps");
  std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(first.train_file.filename().string()), std::string::npos);
  for (const auto& entry : fs::directory_iterator(f.tmp / "cache")) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
  }

  // Editing a data file (same names, same size class) gives a new key: never stale data.
  {
    std::ofstream(f.synthetic / "train.jsonl", std::ios::app)
        << json{{"prompt", "new"}, {"chosen", "a"}, {"rejected", "b"}}.dump() << "\n";
  }
  auto edited = data::create_prompt_dataset(f.options(2), f.tokenizer);
  EXPECT_FALSE(edited.from_cache);
  EXPECT_NE(edited.train_file, first.train_file);

  // So does a tokenizer change that only touches its special tokens.
  json config = json::parse(std::ifstream(f.tokenizer_dir / "tokenizer_config.json"));
  config["add_bos_token"] = false;
  std::ofstream(f.tokenizer_dir / "tokenizer_config.json") << config.dump();
  auto retokenized = data::create_prompt_dataset(f.options(2), tokenizer::Tokenizer::load(f.tokenizer_dir));
  EXPECT_FALSE(retokenized.from_cache);
  EXPECT_NE(retokenized.train.sequence(0).data[0], edited.train.sequence(0).data[0]);

  // And every option that changes the result.
  auto o = f.options(2);
  o.seed = 99;
  EXPECT_NE(data::prompt_dataset_cache_key(o, f.tokenizer), data::prompt_dataset_cache_key(f.options(2), f.tokenizer));
  o = f.options(2);
  o.end_of_conversation_token = "</s>";
  EXPECT_NE(data::prompt_dataset_cache_key(o, f.tokenizer), data::prompt_dataset_cache_key(f.options(2), f.tokenizer));
}

TEST(PromptDataset, CorruptCacheEntryIsRebuilt) {
  Fixture f;
  auto first = data::create_prompt_dataset(f.options(1), f.tokenizer);
  fs::resize_file(first.train_file, fs::file_size(first.train_file) - 4);
  auto rebuilt = data::create_prompt_dataset(f.options(1), f.tokenizer);
  EXPECT_FALSE(rebuilt.from_cache);
  EXPECT_EQ(items_of(rebuilt.train), items_of(first.train));
  EXPECT_THROW_WITH(data::TokenizedDataset::load(f.tmp / "tok" / "vocab.json"), core::FormatError, "bad magic");
}

TEST(PromptDataset, EmptyPhaseAndVanishedFilesAreNamed) {
  Fixture f;
  auto o = f.options(2);
  o.data_split = "10,0,0";
  EXPECT_THROW_WITH(data::create_prompt_dataset(o, f.tokenizer), core::InvalidArgument,
                    "phase 2 has no training data: data_split '10,0,0'");
  o = f.options(1);
  fs::remove(f.jsonfile / "eval.json");
  EXPECT_THROW_WITH(data::create_prompt_dataset(o, f.tokenizer), core::NotFound, "eval.json");
  o.phase = 4;
  EXPECT_THROW_WITH(data::create_prompt_dataset(o, f.tokenizer), core::ConfigError, "phase 4");
}

TEST(PromptDataset, MalformedLineIsNamedOrSkippedAndCounted) {
  Fixture f;
  {
    std::ofstream(f.synthetic / "train.jsonl", std::ios::app) << "{\"prompt\": \"cut off\n";
  }
  auto o = f.options(1);
  EXPECT_THROW_WITH(data::create_prompt_dataset(o, f.tokenizer), core::FormatError, "train.jsonl:28: malformed JSON");
  o.skip_bad_records = true;
  auto data = data::create_prompt_dataset(o, f.tokenizer);
  EXPECT_EQ(data.stats["datasets"][1]["bad_records_skipped"].get<int64_t>(), 1);
}

TEST(PromptDataset, BundledDemoDataBuildsEveryPhase) {
  testing::TempDir tmp;
  auto tok = tokenizer::Tokenizer::load(testing::source_dir() / "assets/gpt2-bpe");
  for (int phase = 1; phase <= 3; ++phase) {
    data::PromptDataOptions o;
    o.phase = phase;
    o.data_path = {{"local/jsonfile:" + (testing::source_dir() / "data/demo").string(), std::nullopt}};
    o.max_seq_len = phase == 3 ? 32 : 64;
    o.end_of_conversation_token = "<|endoftext|>";
    o.cache_dir = tmp.path();
    auto data = data::create_prompt_dataset(o, tok);
    // 2000 train / 200 eval records split 2,4,4; every demo record has all views and short prompts.
    const int64_t expected_train[] = {400, 800, 800}, expected_eval[] = {40, 80, 80};
    EXPECT_EQ(data.train.size(), expected_train[phase - 1]) << "phase " << phase;
    EXPECT_EQ(data.eval.size(), expected_eval[phase - 1]) << "phase " << phase;
  }
}

}  // namespace
}  // namespace dschat
