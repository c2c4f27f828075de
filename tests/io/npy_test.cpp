// load_npy / save_npy: round trips with C++ and NumPy, Fortran order, versions, errors.
#include <gtest/gtest.h>

#include "dschat/core/error.h"
#include "dschat/io/npy.h"
#include "io/io_cases.h"
#include "test_util.h"

namespace dschat {
namespace io {
namespace {

using core::FormatError;
using testing::expected_value;
using testing::same_tensor;
using testing::TempDir;

class NpyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    made_ = testing::run_io_script("npy", dir_->path().string());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(made_); }
  static std::filesystem::path py(const std::string& name) { return dir_->path() / name; }

  // A .npy file with the given header dict text and data bytes (version 1.0).
  std::filesystem::path write(const std::string& dict, const std::string& data) {
    std::string header = dict + "\n";
    std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
    bytes += static_cast<char>(header.size() & 0xff);
    bytes += static_cast<char>(header.size() >> 8);
    auto file = tmp_ / "bad.npy";
    testing::write_bytes(file, bytes + header + data);
    return file;
  }

  static TempDir* dir_;
  static ::testing::AssertionResult made_;
  TempDir tmp_;
};
TempDir* NpyTest::dir_ = nullptr;
::testing::AssertionResult NpyTest::made_ = ::testing::AssertionFailure();

TEST_F(NpyTest, RoundTripEveryDtypeBitwise) {
  for (const auto& [name, tensor] : testing::expected_cases(/*numpy_only=*/true)) {
    save_npy(tmp_ / (name + ".npy"), tensor);
    torch::Tensor back = load_npy(tmp_ / (name + ".npy"));  // [shape of the case]
    EXPECT_TRUE(same_tensor(back, tensor)) << name;
    EXPECT_TRUE(back.is_contiguous());
  }
}

TEST_F(NpyTest, ReadsFilesWrittenByNumpy) {
  for (const auto& [name, tensor] : testing::expected_cases(/*numpy_only=*/true)) {
    EXPECT_TRUE(same_tensor(load_npy(py(name + ".npy")), tensor)) << name;
  }
  EXPECT_TRUE(same_tensor(load_npy(py("v2.npy")), expected_value(torch::kFloat32, {3, 4})));
}

TEST_F(NpyTest, FortranOrderComesBackInLogicalOrder) {
  torch::Tensor f2 = load_npy(py("fortran2d.npy"));
  EXPECT_TRUE(same_tensor(f2, expected_value(torch::kFloat32, {3, 4})));
  EXPECT_TRUE(f2.is_contiguous());
  EXPECT_TRUE(same_tensor(load_npy(py("fortran3d.npy")), expected_value(torch::kInt32, {2, 3, 4})));
}

TEST_F(NpyTest, NumpyReadsFilesWrittenByCpp) {
  for (const auto& [name, tensor] : testing::expected_cases(/*numpy_only=*/true)) {
    save_npy(tmp_ / (name + ".npy"), tensor);
  }
  EXPECT_TRUE(testing::run_io_script("verify-npy", tmp_.path().string()));
}

TEST_F(NpyTest, OutputIsByteIdenticalToNumpySave) {
  for (const char* name : {"f32", "i64", "bool", "scalar", "empty", "u8"}) {
    save_npy(tmp_ / "same.npy", load_npy(py(std::string(name) + ".npy")));
    EXPECT_EQ(testing::read_bytes(tmp_ / "same.npy"), testing::read_bytes(py(std::string(name) + ".npy")))
        << name;
  }
}

TEST_F(NpyTest, SavesNonContiguousTensorsInCOrder) {
  torch::Tensor base = torch::arange(6, torch::kFloat32).reshape({2, 3});  // [2, 3]
  save_npy(tmp_ / "t.npy", base.t());
  EXPECT_TRUE(same_tensor(load_npy(tmp_ / "t.npy"), base.t().contiguous()));
}

TEST_F(NpyTest, BigEndianAndUnsupportedDtypesAreClearErrors) {
  EXPECT_THROW_WITH(load_npy(py("big_endian.npy")), FormatError,
                    "big_endian.npy: descr '>f4' is big-endian; only little-endian .npy files");
  EXPECT_THROW_WITH(load_npy(py("complex.npy")), FormatError, "complex.npy: unsupported dtype descr '<c8'");
  EXPECT_THROW_WITH(save_npy(tmp_ / "b.npy", torch::ones({2}, torch::kBFloat16)), core::InvalidArgument,
                    "b.npy: dtype BFloat16 has no NumPy equivalent");
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "b.npy"));
}

TEST_F(NpyTest, MalformedFilesNameTheFile) {
  EXPECT_THROW_WITH(load_npy(tmp_ / "missing.npy"), core::IoError, "missing.npy: cannot open");
  testing::write_bytes(tmp_ / "magic.npy", "NUMPY not really");
  EXPECT_THROW_WITH(load_npy(tmp_ / "magic.npy"), FormatError, "magic.npy: not a .npy file");
  const std::string data(24, '\0');
  EXPECT_THROW_WITH(load_npy(write("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data.substr(0, 20))),
                    FormatError, "bad.npy: data has 20 bytes, expected 24");
  EXPECT_THROW_WITH(load_npy(write("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", data + "x")),
                    FormatError, "data has 25 bytes, expected 24");
  EXPECT_THROW_WITH(load_npy(write("{'descr': '<f4', 'shape': (2, 3), }", data)), FormatError,
                    "bad.npy: header has no 'fortran_order' key");
  EXPECT_THROW_WITH(load_npy(write("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", data)),
                    FormatError, "unexpected header key 'x'");
  EXPECT_THROW_WITH(load_npy(write("{'descr': '<f4', 'fortran_order': Nope, 'shape': (2, 3)}", data)),
                    FormatError, "expected True or False");
  EXPECT_THROW_WITH(load_npy(write("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}", data)),
                    FormatError, "expected a non-negative integer dimension");
  EXPECT_THROW_WITH(load_npy(write("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", data)),
                    FormatError, "header key 'descr' appears twice");
  EXPECT_THROW_WITH(load_npy(write("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999)}", data)),
                    FormatError, "is too large");
  EXPECT_THROW_WITH(load_npy(write("{'descr': '|b1', 'fortran_order': False, 'shape': (2,)}", "\x01\x05")),
                    FormatError, "bad.npy: bool element 1 has byte value 5");
  // Accepted: no trailing comma, double quotes, a 1-tuple shape.
  torch::Tensor ok = load_npy(  // [2]
      write(R"({"descr": "<i2", "fortran_order": False, "shape": (2,)})", std::string("\x01\x00\x02\x00", 4)));
  EXPECT_TRUE(same_tensor(ok, torch::tensor({1, 2}, torch::kInt16)));
}

}  // namespace
}  // namespace io
}  // namespace dschat
