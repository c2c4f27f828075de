// DeepSpeed-Chat's named datasets on hand-written records in each dataset's real schema, read from
// JSON, JSON Lines and Parquet files and from a hub-cache layout, against the views computed by
// tools/make_data_fixtures.py (Python's re and numpy, as DeepSpeed-Chat computes them).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "dschat/data/raw_dataset.h"
#include "test_util.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path datasets_dir() { return testing::fixture("datasets"); }

json expected_views() {
  std::ifstream in(datasets_dir() / "expected.json");
  return json::parse(in);
}

json optional_json(const std::optional<std::string>& s) { return s ? json(*s) : json(nullptr); }

json views_of(const std::vector<data::PromptRecord>& records) {
  json out = json::array();
  for (const auto& r : records) {
    out.push_back({{"prompt", optional_json(r.prompt)},
                   {"chosen", optional_json(r.chosen)},
                   {"rejected", optional_json(r.rejected)},
                   {"prompt_and_chosen", optional_json(r.prompt_and_chosen)},
                   {"prompt_and_rejected", optional_json(r.prompt_and_rejected)}});
  }
  return out;
}

data::RawDataset load(const std::string& name) {
  data::DatasetSpec spec{name, std::nullopt};
  data::RawDatasetOptions options;
  options.seed = 1234;
  return data::load_raw_dataset(spec, data::locate_dataset(spec, options), options);
}

class NamedDatasetFormats : public ::testing::TestWithParam<std::string> {};

TEST_P(NamedDatasetFormats, EveryDatasetMatchesDeepSpeedChatsViews) {
  const json expected = expected_views();
  int checked = 0;
  for (const auto& [name, views] : expected.items()) {
    const fs::path dir = datasets_dir() / GetParam() / name;
    if (!fs::exists(dir)) continue;  // local/jsonfile has no Parquet variant
    // The data_path names a directory that contains the dataset's name, as DeepSpeed-Chat allows.
    const std::string path = name == "local/jsonfile" ? "local/jsonfile:" + dir.string() : dir.string();
    data::RawDataset raw = load(path);
    EXPECT_EQ(raw.files.name, name);
    EXPECT_EQ(views_of(raw.train), views["train"]) << name << " train from " << GetParam();
    EXPECT_EQ(views_of(raw.eval), views["eval"]) << name << " eval from " << GetParam();
    ++checked;
  }
  EXPECT_GE(checked, GetParam() == "parquet" ? 6 : 7);
}

INSTANTIATE_TEST_SUITE_P(Files, NamedDatasetFormats, ::testing::Values("json", "jsonl", "parquet"));

TEST(NamedDatasets, CleanNamesAreDeepSpeedChats) {
  data::RawDatasetOptions options;
  auto files = data::locate_dataset({(datasets_dir() / "json/Dahoas/rm-static").string(), std::nullopt}, options);
  EXPECT_EQ(files.clean_name, "Dahoas_rm_static");
  files = data::locate_dataset({"local/jsonfile:" + (datasets_dir() / "json/local/jsonfile").string(), std::nullopt},
                               options);
  EXPECT_EQ(files.clean_name, "jsonfile");
}

TEST(NamedDatasets, HubCacheLayoutIsFound) {
  ::setenv("HF_HUB_CACHE", (datasets_dir() / "hub").c_str(), 1);
  data::RawDataset raw = load("Dahoas/rm-static");
  ::unsetenv("HF_HUB_CACHE");
  ASSERT_EQ(raw.files.train.size(), 1u);
  EXPECT_NE(raw.files.train[0].string().find("snapshots/0123456789abcdef/data/train-"), std::string::npos);
  EXPECT_EQ(views_of(raw.train), expected_views()["Dahoas/rm-static"]["train"]);
  EXPECT_EQ(views_of(raw.eval), expected_views()["Dahoas/rm-static"]["eval"]);
}

TEST(NamedDatasets, UnknownNameListsTheSupportedOnes) {
  data::RawDatasetOptions options;
  EXPECT_THROW_WITH(data::locate_dataset({"someone/unknown-set", std::nullopt}, options), core::ConfigError,
                    "supported: Dahoas/rm-static, Dahoas/full-hh-rlhf");
  EXPECT_THROW_WITH(data::locate_dataset({"wangrui6/Zhihu-KOL", std::nullopt}, options), core::Unsupported,
                    "no record format");
  ::setenv("HF_HUB_CACHE", "/nonexistent-hub", 1);
  EXPECT_THROW_WITH(data::locate_dataset({"Dahoas/full-hh-rlhf", std::nullopt}, options), core::NotFound,
                    "/nonexistent-hub/datasets--Dahoas--full-hh-rlhf");
  ::unsetenv("HF_HUB_CACHE");
}

TEST(NamedDatasets, LocalJsonfileNeedsBothFiles) {
  testing::TempDir dir;
  std::ofstream(dir / "train.json") << "[]";
  data::RawDatasetOptions options;
  options.local_jsonfile_dir = dir.path();
  EXPECT_THROW_WITH(data::locate_dataset({"local/jsonfile", std::nullopt}, options), core::NotFound, "eval.json");
}

TEST(NamedDatasets, WebgptCitationCleanupMatchesPythonRe) {
  // expected.json covers this through Python's re; here the scanner's corner cases directly:
  // a closer past a newline does not match, an unclosed bracket stays, "(2)" without a space goes
  // in the second pass.
  testing::TempDir dir;
  const fs::path data = dir.path() / "openai" / "webgpt_comparisons";
  fs::create_directories(data);
  std::ofstream(data / "train.jsonl")
      << R"({"question": {"full_text": "q"}, "answer_0": "a [1] b(2)c [x\ny] z (open", "score_0": 1, )"
      << R"("answer_1": "", "score_1": 0})" << "\n";
  data::RawDataset raw = load(data.string());
  ASSERT_EQ(raw.train.size(), 1u);
  EXPECT_EQ(*raw.train[0].chosen, " a bc [x\ny] z (open");
  EXPECT_EQ(*raw.train[0].rejected, " ");
}

TEST(GenericSchema, UserNamedFieldsAndFormats) {
  testing::TempDir dir;
  std::ofstream(dir / "mine.jsonl") << R"({"q": "Hi?", "good": "Hello.", "bad": "Go."})" << "\n"
                                    << R"({"q": "Bye?", "good": "Bye.", "bad": null})" << "\n";
  json config = {{"path", (dir / "mine.jsonl").string()}, {"prompt_field", "q"}, {"chosen_field", "good"},
                 {"rejected_field", "bad"}, {"eval_path", (dir / "mine.jsonl").string()}};
  auto spec = data::DatasetSpec::from_json(config, "cfg.json: data_path[0]");
  data::RawDatasetOptions options;
  auto raw = data::load_raw_dataset(spec, data::locate_dataset(spec, options), options);
  ASSERT_EQ(raw.train.size(), 2u);
  EXPECT_EQ(*raw.train[0].prompt, " Human: Hi? Assistant:");
  EXPECT_EQ(*raw.train[0].prompt_and_chosen, " Human: Hi? Assistant: Hello.");
  EXPECT_EQ(*raw.train[0].rejected, " Go.");
  EXPECT_FALSE(raw.train[1].rejected.has_value());
  EXPECT_FALSE(raw.train[1].prompt_and_rejected.has_value());

  config["format"] = "raw";
  spec = data::DatasetSpec::from_json(config, "cfg.json: data_path[0]");
  raw = data::load_raw_dataset(spec, data::locate_dataset(spec, options), options);
  EXPECT_EQ(*raw.train[0].prompt_and_chosen, "Hi?Hello.");

  config["format"] = "chatml";
  EXPECT_THROW_WITH(data::DatasetSpec::from_json(config, "cfg.json: data_path[0]"), core::ConfigError,
                    "cfg.json: data_path[0]: key 'format'");
  config.erase("format");
  config["promt_field"] = "q";
  EXPECT_THROW_WITH(data::DatasetSpec::from_json(config, "cfg.json: data_path[0]"), core::ConfigError,
                    "did you mean 'prompt_field'");
}

TEST(GenericSchema, MissingFieldNamesFileLineAndField) {
  testing::TempDir dir;
  std::ofstream(dir / "d.jsonl") << R"({"prompt": "a", "chosen": "b", "rejected": "c"})" << "\n\n"
                                 << R"({"prompt": "a", "rejected": "c"})" << "\n"
                                 << R"({"prompt": "a", "chosen": 5, "rejected": "c"})" << "\n";
  data::DatasetSpec spec{(dir / "d.jsonl").string(), data::GenericSchema{}};
  data::RawDatasetOptions options;
  auto files = data::locate_dataset(spec, options);
  EXPECT_THROW_WITH(data::load_raw_dataset(spec, files, options), core::FormatError,
                    "d.jsonl:3: field 'chosen' is missing");
  options.skip_bad_records = true;
  auto raw = data::load_raw_dataset(spec, files, options);
  EXPECT_EQ(raw.skipped_records, 2);
  EXPECT_EQ(raw.train.size() + raw.eval.size(), 1u);
}

}  // namespace
}  // namespace dschat
