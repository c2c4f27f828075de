// load_torch_bin on archives written by Python torch.save (made at test time by
// make_io_cases.py torchbin): views, tied weights, dtypes, protocol 4, errors; plus a mutation
// fuzz of the pickle VM.
#include <gtest/gtest.h>

#include <caffe2/serialize/inline_container.h>

#include <random>

#include "dschat/core/error.h"
#include "dschat/io/state_dict.h"
#include "io/io_cases.h"
#include "io/pickle_vm.h"
#include "test_util.h"

namespace dschat {
namespace io {
namespace {

using testing::same_tensor;

class TorchBinTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    made_ = testing::run_io_script("torchbin", dir_->path().string());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(made_); }
  static std::filesystem::path path(const std::string& name) { return dir_->path() / name; }

  static torch::Tensor base() {
    return torch::arange(12, torch::kFloat32).reshape({4, 3}) * 0.5 - 3.0;  // [4, 3]
  }

  static testing::TempDir* dir_;
  static ::testing::AssertionResult made_;
};
testing::TempDir* TorchBinTest::dir_ = nullptr;
::testing::AssertionResult TorchBinTest::made_ = ::testing::AssertionFailure();

void expect_views_content(const TensorMap& sd) {
  const torch::Tensor w = torch::arange(12, torch::kFloat32).reshape({4, 3}) * 0.5 - 3.0;  // [4, 3]
  ASSERT_EQ(sd.size(), 16u);
  EXPECT_TRUE(same_tensor(sd.at("w"), w));
  EXPECT_TRUE(same_tensor(sd.at("tied"), w));
  EXPECT_TRUE(same_tensor(sd.at("t"), w.t().contiguous()));
  EXPECT_TRUE(same_tensor(sd.at("slice"), w.slice(0, 1, 3)));
  EXPECT_TRUE(same_tensor(sd.at("col"), w.select(1, 1).contiguous()));
  EXPECT_TRUE(same_tensor(sd.at("h"), (torch::arange(6).reshape({2, 3}) * 0.5).to(torch::kFloat16)));
  EXPECT_TRUE(same_tensor(sd.at("b"), (torch::arange(6).reshape({3, 2}) * 0.25).to(torch::kBFloat16)));
  EXPECT_TRUE(same_tensor(sd.at("i"), torch::arange(5, torch::kInt64) - 2));
  EXPECT_TRUE(same_tensor(sd.at("bool"), torch::tensor({true, false, true})));
  EXPECT_TRUE(same_tensor(sd.at("p"), torch::ones({2})));
  EXPECT_TRUE(same_tensor(sd.at("scalar"), torch::tensor(3.5f)));
  EXPECT_TRUE(same_tensor(sd.at("empty"), torch::zeros({0, 3})));
  EXPECT_TRUE(same_tensor(sd.at("f8"), (torch::arange(4) * 0.5).to(torch::kFloat8_e4m3fn)));
  EXPECT_TRUE(same_tensor(sd.at("u16"), torch::arange(3).to(torch::kUInt16)));
  EXPECT_TRUE(same_tensor(sd.at("i8"), torch::arange(4, torch::kInt8) - 2));
  EXPECT_TRUE(same_tensor(sd.at("d"), torch::arange(3, torch::kFloat64) / 4));
}

TEST_F(TorchBinTest, ReadsEveryTensorOfAPythonStateDict) { expect_views_content(load_torch_bin(path("views.bin"))); }

TEST_F(TorchBinTest, PickleProtocol4ArchiveReadsTheSame) {
  expect_views_content(load_torch_bin(path("views_p4.bin")));
}

TEST_F(TorchBinTest, TiedWeightsAndViewsShareOneStorage) {
  TensorMap sd = load_torch_bin(path("views.bin"));
  const auto& w = sd.at("w");
  EXPECT_EQ(sd.at("tied").data_ptr(), w.data_ptr());
  EXPECT_TRUE(sd.at("t").storage().is_alias_of(w.storage()));
  EXPECT_EQ(sd.at("t").strides(), c10::IntArrayRef({1, 3}));
  EXPECT_EQ(sd.at("slice").storage_offset(), 3);
  EXPECT_EQ(sd.at("slice").data_ptr<float>(), w.data_ptr<float>() + 3);
  EXPECT_EQ(sd.at("col").storage_offset(), 1);
  EXPECT_EQ(sd.at("col").strides(), c10::IntArrayRef({3}));
  // One buffer: writing through the tied key shows in every view of it.
  sd.at("tied").index_put_({1, 1}, 100.0f);
  EXPECT_EQ(sd.at("t")[1][1].item<float>(), 100.0f);
  EXPECT_EQ(sd.at("slice")[0][1].item<float>(), 100.0f);
  EXPECT_EQ(sd.at("col")[1].item<float>(), 100.0f);
  EXPECT_NE(sd.at("h").data_ptr(), w.data_ptr());
}

TEST_F(TorchBinTest, ModuleStateDictWithMetadataMatchesSafetensorsCopy) {
  TensorMap bin = load_torch_bin(path("module.bin"));
  TensorMap st = load_safetensors(path("module.safetensors"));
  ASSERT_EQ(bin.size(), 4u);
  testing::expect_same_maps(bin, st);
}

TEST_F(TorchBinTest, ShardedBinIndexLoadsThroughLoadStateDict) {
  TensorMap sharded = load_state_dict(path("bin_sharded"));
  testing::expect_same_maps(sharded, load_safetensors(path("module.safetensors")));
}

TEST_F(TorchBinTest, MissingOrCorruptFilesNameTheFile) {
  EXPECT_THROW_WITH(load_torch_bin(path("nope.bin")), core::IoError, "nope.bin: cannot open");
  testing::write_bytes(path("garbage.bin"), std::string(300, 'x'));
  EXPECT_THROW_WITH(load_torch_bin(path("garbage.bin")), core::FormatError,
                    "garbage.bin: cannot read the torch.save zip archive");
  std::string whole = testing::read_bytes(path("views.bin"));
  for (size_t cut : {whole.size() / 2, whole.size() - 10, size_t{30}}) {
    testing::write_bytes(path("truncated.bin"), whole.substr(0, cut));
    EXPECT_THROW_WITH(load_torch_bin(path("truncated.bin")), core::IoError, "truncated.bin: ");
  }
  EXPECT_THROW_WITH(load_torch_bin(path("legacy.bin")), core::FormatError,
                    "legacy.bin: legacy (pre-1.6, non-zip) torch.save format is not supported");
}

TEST_F(TorchBinTest, RefusesContentOutsidePlainStateDicts) {
  EXPECT_THROW_WITH(load_torch_bin(path("non_tensor.bin")), core::FormatError,
                    "non_tensor.bin: key 'step' holds the int 3, not a tensor");
  EXPECT_THROW_WITH(load_torch_bin(path("foreign_global.bin")), core::FormatError,
                    "foreign_global.bin: data.pkl: unsupported pickle global 'collections.Counter'");
  EXPECT_THROW_WITH(load_torch_bin(path("past_storage.bin")), core::FormatError,
                    "past_storage.bin: data.pkl: tensor view (offset 0, size [100], stride [1]) "
                    "reaches past its 4-element storage");
  EXPECT_THROW_WITH(load_torch_bin(path("bad_opcode.bin")), core::FormatError,
                    "bad_opcode.bin: data.pkl: pickle byte 2: unsupported pickle opcode 0x49 'I'");
}

// Hooks that accept everything, so that the fuzz exercises the VM itself.
class PermissiveHooks : public PickleHooks {
 public:
  PickleValuePtr global(const std::string& module, const std::string& name) override {
    auto v = PickleValue::make(PickleValue::Kind::Global);
    v->text = module + "." + name;
    return v;
  }
  PickleValuePtr reduce(const PickleValue&, const PickleValue&) override {
    return PickleValue::make(PickleValue::Kind::Dict);
  }
  void build(PickleValue&, const PickleValue&) override {}
  PickleValuePtr persistent_load(const PickleValue&) override {
    return PickleValue::make(PickleValue::Kind::None);
  }
};

TEST_F(TorchBinTest, PickleVmSurvivesRandomMutations) {
  caffe2::serialize::PyTorchStreamReader reader(path("views.bin").string());
  auto [data, size] = reader.getRecord("data.pkl");
  const std::string pickle(static_cast<const char*>(data.get()), size);
  PermissiveHooks hooks;
  ASSERT_NO_THROW(unpickle("views", reinterpret_cast<const uint8_t*>(pickle.data()), pickle.size(), hooks));
  std::mt19937_64 rng(7);
  int ok = 0, rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = pickle;
    if (i % 3 == 0) bytes.resize(rng() % bytes.size());
    for (int k = 1 + rng() % 4; k > 0 && !bytes.empty(); --k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    try {
      unpickle("fuzz", reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), hooks);
      ++ok;
    } catch (const core::Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace io
}  // namespace dschat
