// load_state_dict / save_state_dict: single file, sharded saves (read back by C++ and Python),
// stale-layout cleanup, lookup order and index errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "dschat/core/error.h"
#include "dschat/io/state_dict.h"
#include "io/io_cases.h"
#include "test_util.h"

namespace dschat {
namespace io {
namespace {

namespace fs = std::filesystem;
using testing::expect_same_maps;
using testing::expected_cases;
using testing::TempDir;

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

nlohmann::json read_json(const fs::path& file) { return nlohmann::json::parse(testing::read_bytes(file)); }

int64_t total_bytes(const TensorMap& tensors) {
  int64_t total = 0;
  for (const auto& [name, t] : tensors) total += t.numel() * t.element_size();
  return total;
}

TEST(StateDictTest, SmallModelIsOneSafetensorsFileWithFormatMetadata) {
  TempDir dir;
  save_state_dict(dir.path(), expected_cases(), int64_t{1} << 20, {{"origin", "c++"}});
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"model.safetensors"});
  Metadata metadata;
  expect_same_maps(load_safetensors(dir / "model.safetensors", &metadata), expected_cases());
  EXPECT_EQ(metadata, (Metadata{{"format", "pt"}, {"origin", "c++"}}));
  expect_same_maps(load_state_dict(dir.path()), expected_cases());
}

TEST(StateDictTest, ShardedSaveRoundTripsThroughCppAndPython) {
  TempDir dir;
  const TensorMap tensors = expected_cases();  // 17 tensors, 300 bytes
  const int64_t max_shard = 64;
  save_state_dict(dir.path(), tensors, max_shard);

  auto index = read_json(dir / "model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total_bytes(tensors));
  std::set<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) shards.insert(shard.get<std::string>());
  ASSERT_GE(shards.size(), 3u);
  EXPECT_EQ(index["weight_map"].size(), tensors.size());
  for (size_t i = 1; i <= shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i, shards.size());
    EXPECT_TRUE(shards.count(name)) << name;
  }
  for (const auto& shard : shards) {
    TensorMap part = load_safetensors(dir / shard);
    // Over the limit only when one tensor alone is bigger than it.
    EXPECT_TRUE(total_bytes(part) <= max_shard || part.size() == 1) << shard;
    for (const auto& [name, t] : part) EXPECT_EQ(index["weight_map"][name], shard);
  }
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  expect_same_maps(load_state_dict(dir.path()), tensors);
  EXPECT_TRUE(testing::run_io_script("verify-sharded", dir.path().string()));
}

TEST(StateDictTest, EachShardIsMappedOnce) {
  TempDir dir;
  save_state_dict(dir.path(), expected_cases(), 64);
  TensorMap loaded = load_state_dict(dir.path());
  auto index = read_json(dir / "model.safetensors.index.json");
  std::set<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) shards.insert(shard.get<std::string>());
  for (const auto& shard : shards) EXPECT_EQ(testing::mappings_of(dir / shard).size(), 1u) << shard;
}

TEST(StateDictTest, ResavingRemovesFilesOfTheEarlierLayout) {
  TempDir dir;
  TensorMap tensors;
  for (int i = 0; i < 6; ++i) tensors["w" + std::to_string(i)] = torch::full({4}, float(i));  // 16 B each
  save_state_dict(dir.path(), tensors, 16);  // 6 shards
  EXPECT_TRUE(fs::exists(dir / "model-00006-of-00006.safetensors"));
  testing::write_bytes(dir / "config.json", "{}");  // unrelated files stay

  save_state_dict(dir.path(), tensors, 48);  // 2 shards
  EXPECT_EQ(files_in(dir.path()),
            (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors", "model.safetensors.index.json"}));
  expect_same_maps(load_state_dict(dir.path()), tensors);

  save_state_dict(dir.path(), tensors);  // one file
  EXPECT_EQ(files_in(dir.path()), (std::vector<std::string>{"config.json", "model.safetensors"}));

  tensors["w0"] = torch::full({4}, 9.0f);
  save_state_dict(dir.path(), tensors, 48);  // sharded again: the single file must go
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  expect_same_maps(load_state_dict(dir.path()), tensors);
}

TEST(StateDictTest, PrefersSafetensorsOverBin) {
  TempDir dir;
  save_safetensors(dir / "model.safetensors", {{"w", torch::ones({2})}});
  testing::write_bytes(dir / "pytorch_model.bin", "not even a zip");
  EXPECT_TRUE(torch::equal(load_state_dict(dir.path()).at("w"), torch::ones({2})));
}

TEST(StateDictTest, NothingToLoadListsTheFileNames) {
  TempDir dir;
  EXPECT_THROW_WITH(load_state_dict(dir.path()), core::NotFound,
                    dir.path().string() + ": no checkpoint found; looked for model.safetensors, "
                                          "model.safetensors.index.json, pytorch_model.bin and "
                                          "pytorch_model.bin.index.json");
  EXPECT_THROW_WITH(load_state_dict(dir / "absent"), core::NotFound, "(the directory does not exist)");
}

TEST(StateDictTest, IndexErrorsNameIndexShardAndTensor) {
  TempDir dir;
  save_safetensors(dir / "shard-a.safetensors", {{"a", torch::ones({2})}});
  const auto index = dir / "model.safetensors.index.json";
  auto write_index = [&](const std::string& text) { testing::write_bytes(index, text); };

  write_index(R"({"weight_map": {"a": "shard-a.safetensors", "b": "shard-a.safetensors"}})");
  EXPECT_THROW_WITH(load_state_dict(dir.path()), core::FormatError,
                    index.string() + ": tensor 'b' is mapped to shard " + (dir / "shard-a.safetensors").string() +
                        ", which does not contain it");
  write_index(R"({"weight_map": {"a": "shard-z.safetensors"}})");
  EXPECT_THROW_WITH(load_state_dict(dir.path()), core::IoError, "shard-z.safetensors: cannot open");
  write_index(R"({"weight_map": {"a": "../shard-a.safetensors"}})");
  EXPECT_THROW_WITH(load_state_dict(dir.path()), core::FormatError,
                    "tensor 'a' maps to shard '../shard-a.safetensors', which is not a file name");
  write_index(R"({"weight_map": {"a": 3}})");
  EXPECT_THROW_WITH(load_state_dict(dir.path()), core::FormatError, "weight_map entry 'a' must be a file name");
  write_index(R"({"metadata": {}})");
  EXPECT_THROW_WITH(load_state_dict(dir.path()), core::FormatError, "expected an object with a 'weight_map'");
  write_index("{oops");
  EXPECT_THROW_WITH(load_state_dict(dir.path()), core::FormatError, index.string() + ": not valid JSON");

  write_index(R"({"weight_map": {"a": "shard-a.safetensors"}})");
  TensorMap loaded = load_state_dict(dir.path());
  EXPECT_EQ(loaded.size(), 1u);
  EXPECT_TRUE(torch::equal(loaded.at("a"), torch::ones({2})));
}

TEST(StateDictTest, RejectsNonPositiveShardSize) {
  TempDir dir;
  EXPECT_THROW_WITH(save_state_dict(dir.path(), expected_cases(), 0), core::InvalidArgument,
                    "max_shard_bytes must be positive, got 0");
}

}  // namespace
}  // namespace io
}  // namespace dschat
