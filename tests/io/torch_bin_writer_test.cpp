// save_torch_bin: what dschat writes as pytorch_model.bin reads back bit for bit here and in
// Python's torch.load(weights_only=True) (the restricted unpickler transformers and DeepSpeed-Chat
// load through), for every dtype and shape a state dict holds.
#include <gtest/gtest.h>

#include <fstream>

#include "dschat/core/error.h"
#include "dschat/io/state_dict.h"
#include "test_util.h"

namespace dschat {
namespace io {
namespace {

namespace fs = std::filesystem;

TensorMap mixed_state_dict() {
  TensorMap t;
  t["a.weight"] = torch::linspace(-1.7, 2.9, 12).reshape({4, 3}).exp();          // [4, 3]
  t["b.half"] = torch::linspace(-2, 2, 10).to(torch::kFloat16);                 // [10]
  t["c.bf16"] = torch::linspace(-1, 3, 6).reshape({2, 3}).to(torch::kBFloat16);  // [2, 3]
  t["d.ids"] = torch::tensor({int64_t{-1}, int64_t{1} << 40, int64_t{300}, int64_t{70000}});  // [4]
  t["e.mask"] = torch::tensor({true, false, true});                              // [3]
  t["f.scalar"] = torch::tensor(2.5, torch::kFloat64);                           // []
  t["g.transposed"] = torch::arange(6, torch::kFloat32).reshape({2, 3}).t();     // [3, 2], not contiguous
  t["h.empty"] = torch::zeros({0, 5});                                            // [0, 5]
  t["i.long_dim"] = torch::arange(70000, torch::kInt32).to(torch::kInt8);        // [70000]
  return t;
}

void expect_equal_maps(const TensorMap& got, const TensorMap& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, tensor] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const torch::Tensor& g = got.at(name);
    EXPECT_EQ(g.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_EQ(g.sizes(), tensor.sizes()) << name;
    EXPECT_TRUE(torch::equal(g, tensor)) << name;
  }
}

TEST(TorchBinWriter, ReadsBackEveryDtypeAndShape) {
  testing::TempDir tmp;
  const TensorMap tensors = mixed_state_dict();
  save_torch_bin(tmp / "pytorch_model.bin", tensors);
  expect_equal_maps(load_torch_bin(tmp / "pytorch_model.bin"), tensors);
}

TEST(TorchBinWriter, PythonTorchLoadReadsItWithWeightsOnly) {
  testing::TempDir tmp;
  const TensorMap tensors = mixed_state_dict();
  save_torch_bin(tmp / "pytorch_model.bin", tensors);
  // torch.load's restricted unpickler reads it; safetensors' writer hands the tensors back to us.
  const std::string script =
      "import collections, json, sys, torch\n"
      "from safetensors.torch import save_file\n"
      "sd = torch.load('" + (tmp / "pytorch_model.bin").string() + "', weights_only=True, map_location='cpu')\n"
      "save_file({k: v.contiguous() for k, v in sd.items()}, '" + (tmp / "back.safetensors").string() + "')\n"
      "json.dump({'type': type(sd).__name__, 'keys': list(sd.keys())}, open(sys.argv[1], 'w'))\n";
  const nlohmann::json seen = testing::run_python_json(script);
  ASSERT_TRUE(seen.is_object()) << seen;
  EXPECT_EQ(seen["type"], "OrderedDict");
  std::vector<std::string> names;
  for (const auto& [name, tensor] : tensors) names.push_back(name);
  EXPECT_EQ(seen["keys"].get<std::vector<std::string>>(), names);  // name order, as written
  expect_equal_maps(load_safetensors(tmp / "back.safetensors"), tensors);
}

TEST(TorchBinWriter, ABinSaveReplacesTheSafetensorsLayout) {
  testing::TempDir tmp;
  TensorMap first = {{"w", torch::ones({2, 2})}};
  save_state_dict(tmp.path(), first, int64_t{16});  // model.safetensors
  save_state_dict(tmp.path(), {{"w", torch::ones({2, 2})}, {"v", torch::ones({3})}}, int64_t{8});  // sharded
  ASSERT_TRUE(fs::exists(tmp / "model.safetensors.index.json"));
  const TensorMap second = {{"w", torch::full({2, 2}, 3.0)}};
  save_state_dict(tmp.path(), second, WeightsFormat::kTorchBin);
  EXPECT_TRUE(fs::exists(tmp / "pytorch_model.bin"));
  EXPECT_FALSE(fs::exists(tmp / "model.safetensors"));
  EXPECT_FALSE(fs::exists(tmp / "model.safetensors.index.json"));
  for (const auto& entry : fs::directory_iterator(tmp.path())) {
    EXPECT_EQ(entry.path().extension(), ".bin") << entry.path();
  }
  expect_equal_maps(load_state_dict(tmp.path()), second);
}

TEST(TorchBinWriter, ErrorsNameTheTensorOrFileAndLeaveNothing) {
  testing::TempDir tmp;
  EXPECT_THROW_WITH(save_torch_bin(tmp / "a.bin", {{"fp8", torch::zeros({2}).to(torch::kFloat8_e4m3fn)}}),
                    core::InvalidArgument, "tensor 'fp8' has dtype");
  EXPECT_THROW_WITH(save_torch_bin(tmp / "a.bin", {{"nothing", torch::Tensor()}}), core::InvalidArgument,
                    "tensor 'nothing' is undefined");
  EXPECT_FALSE(fs::exists(tmp / "a.bin"));
  EXPECT_THROW_WITH(save_torch_bin(tmp / "missing_dir" / "a.bin", {{"w", torch::ones({1})}}), core::IoError,
                    "missing_dir");
  EXPECT_THROW_WITH(parse_weights_format("pt", "--save-format"), core::ConfigError,
                    "--save-format: 'pt' is not a weights format (safetensors or bin)");
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(tmp.path())) left.push_back(entry.path().filename().string());
  EXPECT_TRUE(left.empty()) << left.front();
}

}  // namespace
}  // namespace io
}  // namespace dschat
