// load_safetensors / save_safetensors: round trips (C++ and Python), zero copy, copy-on-write,
// atomic replacement and the header layout. Malformed files: safetensors_errors_test.cpp.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>

#include "dschat/core/error.h"
#include "dschat/io/state_dict.h"
#include "io/io_cases.h"
#include "test_util.h"

namespace dschat {
namespace io {
namespace {

using testing::expect_same_maps;
using testing::expected_cases;
using testing::same_tensor;
using testing::TempDir;

bool has_temp_files(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  }
  return false;
}

TEST(SafetensorsTest, RoundTripEveryDtypeBitwise) {
  TempDir dir;
  TensorMap tensors = expected_cases();
  save_safetensors(dir / "all.safetensors", tensors, {{"origin", "c++"}, {"note", "é ünïcode"}});
  Metadata metadata;
  TensorMap loaded = load_safetensors(dir / "all.safetensors", &metadata);
  expect_same_maps(loaded, tensors);
  EXPECT_EQ(metadata, (Metadata{{"origin", "c++"}, {"note", "é ünïcode"}}));
  EXPECT_FALSE(has_temp_files(dir.path()));
}

TEST(SafetensorsTest, ReadsFileWrittenByPython) {
  TempDir dir;
  ASSERT_TRUE(testing::run_io_script("safetensors", (dir / "py.safetensors").string()));
  Metadata metadata;
  TensorMap loaded = load_safetensors(dir / "py.safetensors", &metadata);
  expect_same_maps(loaded, expected_cases());
  EXPECT_EQ(metadata.at("origin"), "python");
}

TEST(SafetensorsTest, PythonReadsFileWrittenByCpp) {
  TempDir dir;
  save_safetensors(dir / "cpp.safetensors", expected_cases(), {{"origin", "c++"}});
  EXPECT_TRUE(testing::run_io_script("verify-safetensors", (dir / "cpp.safetensors").string()));
}

TEST(SafetensorsTest, TensorsAliasTheMappingAndOutliveTheLoader) {
  TempDir dir;
  const auto file = dir / "m.safetensors";
  save_safetensors(file, expected_cases());
  {
    TensorMap loaded = load_safetensors(file);
    // The loader's own handle on the mapping is gone; only the tensors hold it now.
    const torch::Tensor& f32 = loaded.at("f32");
    EXPECT_TRUE(testing::in_mapping_of(f32.data_ptr(), f32.nbytes(), file));
    EXPECT_TRUE(testing::in_mapping_of(loaded.at("bf16").data_ptr(), 12, file));
    for (const auto& [name, t] : loaded) {  // every dtype is written aligned: nothing is copied
      if (t.numel() > 0) {
        EXPECT_TRUE(testing::in_mapping_of(t.data_ptr(), t.nbytes(), file)) << name;
      }
    }
    EXPECT_EQ(testing::mappings_of(file).size(), 1u) << "one mapping shared by all tensors";

    torch::Tensor keep = loaded.at("f32").view({6, 4});  // [6, 4] view keeps the mapping alive
    loaded.clear();
    std::filesystem::remove(file);  // the mapping keeps the (deleted) inode readable
    EXPECT_TRUE(same_tensor(keep, expected_cases().at("f32").view({6, 4})));
    EXPECT_EQ(testing::mappings_of(file).size(), 1u);
  }
  EXPECT_TRUE(testing::mappings_of(file).empty()) << "unmapped with the last tensor";
}

TEST(SafetensorsTest, InPlaceWritesAreCopyOnWriteAndNeverReachTheFile) {
  TempDir dir;
  const auto file = dir / "cow.safetensors";
  save_safetensors(file, expected_cases());
  const std::string before = testing::read_bytes(file);
  {
    TensorMap loaded = load_safetensors(file);
    loaded.at("f32").fill_(42.0f);
    loaded.at("i64").add_(1);
    EXPECT_EQ(loaded.at("f32").max().item<float>(), 42.0f);
    TensorMap again = load_safetensors(file);  // a second mapping sees the file, not our writes
    expect_same_maps(again, expected_cases());
  }
  EXPECT_EQ(testing::read_bytes(file), before);
}

TEST(SafetensorsTest, MisalignedTensorIsCopiedCorrectly) {
  TempDir dir;
  // U8 "a" takes 1 byte, so F32 "b" starts at an odd file offset (the header is 8-aligned).
  std::string header =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
      R"("b":{"dtype":"F32","shape":[2,2],"data_offsets":[1,17]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  float values[4] = {1.5f, -2.0f, 3.25f, 1e30f};
  std::string data(1, '\x07');
  data.append(reinterpret_cast<const char*>(values), sizeof(values));
  const auto file = dir / "odd.safetensors";
  testing::write_bytes(file, testing::safetensors_bytes(header, data));

  TensorMap loaded = load_safetensors(file);
  const torch::Tensor& b = loaded.at("b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data_ptr()) % alignof(float), 0u);
  EXPECT_FALSE(testing::in_mapping_of(b.data_ptr(), 16, file)) << "misaligned data is copied";
  EXPECT_TRUE(same_tensor(b, torch::from_blob(values, {2, 2}, torch::kFloat32)));
  EXPECT_EQ(loaded.at("a").item<uint8_t>(), 7);
  EXPECT_TRUE(testing::in_mapping_of(loaded.at("a").data_ptr(), 1, file)) << "U8 needs no alignment";
}

TEST(SafetensorsTest, HeaderIsPaddedOrderedAndContiguous) {
  TempDir dir;
  TensorMap tensors = {{"z", torch::ones({3}, torch::kFloat16)},
                       {"a", torch::zeros({2, 2})},
                       {"m", torch::arange(3, torch::kInt64)}};
  const auto file = dir / "layout.safetensors";
  save_safetensors(file, tensors, {{"format", "pt"}});
  const std::string bytes = testing::read_bytes(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "data section starts 8-byte aligned";
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' ') + 1, header.find_last_of('}') + 1) << "space padding";
  EXPECT_LT(header.find("\"a\""), header.find("\"m\""));
  EXPECT_LT(header.find("\"m\""), header.find("\"z\""));
  auto json = nlohmann::json::parse(header);
  EXPECT_EQ(json["__metadata__"]["format"], "pt");
  // Data: 8-byte elements first, then 4, then 2 (each start aligned), with no gaps.
  EXPECT_EQ(json["m"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(json["a"]["data_offsets"], nlohmann::json({24, 40}));
  EXPECT_EQ(json["z"]["data_offsets"], nlohmann::json({40, 46}));
  EXPECT_EQ(json["z"]["dtype"], "F16");
  EXPECT_EQ(bytes.size(), 8 + n + 46);

  save_safetensors(file, tensors);  // no metadata: no __metadata__ key at all
  EXPECT_EQ(testing::read_bytes(file).find("__metadata__"), std::string::npos);
}

TEST(SafetensorsTest, SavesViewsAndNonContiguousTensorsAsContiguousCopies) {
  TempDir dir;
  torch::Tensor base = torch::arange(12, torch::kFloat32).reshape({3, 4});  // [3, 4]
  TensorMap tensors = {{"t", base.t()}, {"col", base.select(1, 2)}, {"row", base[1]}};
  save_safetensors(dir / "v.safetensors", tensors);
  TensorMap loaded = load_safetensors(dir / "v.safetensors");
  for (const auto& [name, t] : tensors) {
    EXPECT_TRUE(same_tensor(loaded.at(name), t.contiguous())) << name;
    EXPECT_TRUE(loaded.at(name).is_contiguous()) << name;
  }
}

TEST(SafetensorsTest, AtomicReplaceKeepsLiveTensorsOnTheOldData) {
  TempDir dir;
  const auto file = dir / "r.safetensors";
  save_safetensors(file, {{"w", torch::full({4}, 1.0f)}});
  TensorMap old = load_safetensors(file);
  save_safetensors(file, {{"w", torch::full({4}, 2.0f)}});  // rename over the mapped file
  EXPECT_TRUE(torch::equal(old.at("w"), torch::full({4}, 1.0f)));
  EXPECT_TRUE(torch::equal(load_safetensors(file).at("w"), torch::full({4}, 2.0f)));
  EXPECT_FALSE(has_temp_files(dir.path()));
}

TEST(SafetensorsTest, SaveErrorsNameTheFileAndLeaveNoTempFile) {
  TempDir dir;
  EXPECT_THROW_WITH(save_safetensors(dir / "missing_dir" / "x.safetensors", {{"w", torch::ones(2)}}),
                    core::IoError, "missing_dir/x.safetensors");
  EXPECT_THROW_WITH(save_safetensors(dir / "c.safetensors",
                                     {{"cplx", torch::zeros({2}, torch::kComplexFloat)}}),
                    core::InvalidArgument, "c.safetensors: tensor 'cplx' has dtype ComplexFloat");
  EXPECT_THROW_WITH(save_safetensors(dir / "m.safetensors", {{"__metadata__", torch::ones(1)}}),
                    core::InvalidArgument, "'__metadata__' is reserved");
  EXPECT_THROW_WITH(save_safetensors(dir / "u.safetensors", {{"bad\xff", torch::ones(1)}}),
                    core::InvalidArgument, "u.safetensors: a tensor name or metadata string");
  EXPECT_FALSE(std::filesystem::exists(dir / "c.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "u.safetensors"));
  EXPECT_FALSE(has_temp_files(dir.path()));
}

TEST(SafetensorsTest, EmptyMapRoundTrips) {
  TempDir dir;
  save_safetensors(dir / "e.safetensors", {});
  Metadata metadata{{"stale", "x"}};
  EXPECT_TRUE(load_safetensors(dir / "e.safetensors", &metadata).empty());
  EXPECT_TRUE(metadata.empty());
}

}  // namespace
}  // namespace io
}  // namespace dschat
