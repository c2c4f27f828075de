// Reading data files: every JSON shape HF's json loader accepts, and errors that name file and line.
#include <gtest/gtest.h>

#include <fstream>

#include "data/row_table.h"
#include "dschat/data/unsupervised.h"
#include "dschat/tokenizer/tokenizer.h"
#include "test_util.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;

fs::path write(const testing::TempDir& dir, const std::string& name, const std::string& text) {
  std::ofstream(dir / name, std::ios::binary) << text;
  return dir / name;
}

TEST(RowTable, ReadsEveryJsonShape) {
  testing::TempDir dir;
  auto lines = data::read_rows(write(dir, "a.jsonl", "{\"x\": 1}\n\n  \n{\"x\": 2}\r\n"), false);
  ASSERT_EQ(lines.rows.size(), 2u);
  EXPECT_EQ(lines.rows[1]["x"], 2);
  EXPECT_EQ(lines.lines, (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(lines.where(1), (dir / "a.jsonl").string() + ":4");

  auto json_lines_in_json = data::read_rows(write(dir, "b.json", "\xEF\xBB\xBF{\"x\": 1}\n{\"x\": 2}\n"), false);
  EXPECT_EQ(json_lines_in_json.rows.size(), 2u);
  auto array = data::read_rows(write(dir, "c.json", "[\n {\"x\": 1},\n {\"x\": 2},\n {\"x\": 3}\n]"), false);
  EXPECT_EQ(array.rows.size(), 3u);
  auto columns = data::read_rows(write(dir, "d.json", "{\"x\": [1, 2], \"y\": [\"a\", \"b\"]}"), false);
  ASSERT_EQ(columns.rows.size(), 2u);
  EXPECT_EQ(columns.rows[1]["y"], "b");
  auto wrapped = data::read_rows(write(dir, "e.json", "{\"data\": [{\"x\": 1}]}"), false);
  ASSERT_EQ(wrapped.rows.size(), 1u);
  EXPECT_EQ(wrapped.rows[0]["x"], 1);
  auto single = data::read_rows(write(dir, "f.json", "{\"x\": 1, \"y\": \"z\"}"), false);
  EXPECT_EQ(single.rows.size(), 1u);
  EXPECT_TRUE(data::read_rows(write(dir, "g.jsonl", ""), false).rows.empty());
}

TEST(RowTable, ErrorsNameFileAndLine) {
  testing::TempDir dir;
  auto bad = write(dir, "bad.jsonl", "{\"x\": 1}\n{\"x\": \n{\"x\": 3}\n[1]\n");
  EXPECT_THROW_WITH(data::read_rows(bad, false), core::FormatError, "bad.jsonl:2: malformed JSON");
  auto skipped = data::read_rows(bad, true);
  EXPECT_EQ(skipped.rows.size(), 2u);
  EXPECT_EQ(skipped.skipped_lines, 2);
  EXPECT_THROW_WITH(data::read_rows(write(dir, "arr.json", "[\n{\"x\": 1},\n{\"x\": }\n]"), false), core::FormatError,
                    "arr.json:3: malformed JSON");
  EXPECT_THROW_WITH(data::read_rows(write(dir, "cols.json", "{\"x\": [1, 2], \"y\": [1]}"), false), core::FormatError,
                    "column 'y' has 1 values");
  EXPECT_THROW_WITH(data::read_rows(dir / "missing.jsonl", false), core::IoError, "missing.jsonl: no such file");
  EXPECT_THROW_WITH(data::read_rows(write(dir, "x.csv", "a,b"), false), core::FormatError, "unsupported data file type '.csv'");
  EXPECT_THROW_WITH(data::read_rows(dir.path(), false), core::FormatError, "unsupported data file type");
}

TEST(Unsupervised, ConcatenatesTextsIntoBlocks) {
  testing::TempDir dir;
  auto tok = tokenizer::Tokenizer::load(testing::source_dir() / "assets/gpt2-bpe");
  std::string text;
  std::vector<int64_t> stream;
  for (int i = 0; i < 20; ++i) {
    std::string line = "Line " + std::to_string(i) + " of some unsupervised text.";
    text += nlohmann::json{{"text", line}, {"meta", i}}.dump() + "\n";
    auto ids = tok.encode(line);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  data::UnsupervisedDataOptions options;
  options.paths = {write(dir, "train.jsonl", text).string()};
  options.block_size = 16;
  options.cache_dir = dir / "cache";
  auto blocks = data::create_unsupervised_dataset(options, tok);
  ASSERT_EQ(blocks.size(), static_cast<int64_t>(stream.size()) / 16);
  for (int64_t b = 0; b < blocks.size(); ++b) {
    auto span = blocks.sequence(b);
    ASSERT_EQ(span.size, 16);
    EXPECT_EQ(std::vector<int64_t>(span.begin(), span.end()),
              std::vector<int64_t>(stream.begin() + b * 16, stream.begin() + (b + 1) * 16));
  }
  auto cached = data::create_unsupervised_dataset(options, tok);
  EXPECT_EQ(cached.size(), blocks.size());

  options.text_field = "body";
  EXPECT_THROW_WITH(data::create_unsupervised_dataset(options, tok), core::FormatError,
                    "train.jsonl:1: no string field 'body'");
  options.text_field = "text";
  options.block_size = 100000;
  EXPECT_THROW_WITH(data::create_unsupervised_dataset(options, tok), core::InvalidArgument, "less than one block");
}

}  // namespace
}  // namespace dschat
