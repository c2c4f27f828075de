#pragma once
// Shared by the IO tests: the dtype cases (mirrored in tests/io/make_io_cases.py, which computes
// the same values, so files cross between C++ and Python bitwise), the Python helper runner,
// raw safetensors crafting and a /proc/self/maps probe for zero-copy checks.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dschat/io/state_dict.h"
#include "test_util.h"

namespace dschat {
namespace testing {

struct DtypeCase {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
};

inline const std::vector<DtypeCase>& dtype_cases() {
  static const std::vector<DtypeCase> cases = {
      {"f64", torch::kFloat64, {3}},           {"f32", torch::kFloat32, {2, 3, 4}},
      {"f16", torch::kFloat16, {4, 5}},        {"bf16", torch::kBFloat16, {2, 3}},
      {"i64", torch::kInt64, {5}},             {"i32", torch::kInt32, {2, 2}},
      {"i16", torch::kInt16, {3}},             {"i8", torch::kInt8, {6}},
      {"u64", torch::kUInt64, {2}},            {"u32", torch::kUInt32, {2}},
      {"u16", torch::kUInt16, {2}},            {"u8", torch::kUInt8, {7}},
      {"bool", torch::kBool, {9}},             {"f8_e4m3", torch::kFloat8_e4m3fn, {2, 3}},
      {"f8_e5m2", torch::kFloat8_e5m2, {2, 3}}, {"scalar", torch::kFloat32, {}},
      {"empty", torch::kFloat32, {0, 4}},
  };
  return cases;
}

/// The value of a case: a pure function of (dtype, shape); see expected() in make_io_cases.py.
inline torch::Tensor expected_value(torch::ScalarType dtype, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  torch::Tensor idx = torch::arange(n, torch::kInt64);  // [n]
  torch::Tensor v;  // [n]
  if (dtype == torch::kBool) {
    v = idx.remainder(3).eq(0);
  } else if (c10::isFloatingType(dtype)) {
    v = (idx.to(torch::kFloat64) * 0.25 - 1.0).to(dtype);
  } else if (dtype == torch::kUInt8 || dtype == torch::kUInt16 || dtype == torch::kUInt32 ||
             dtype == torch::kUInt64) {
    v = (idx * 37).remainder(251).to(dtype);
  } else {
    v = ((idx * 37).remainder(251) - 125).to(dtype);
  }
  return v.reshape(shape);  // [shape...]
}

inline io::TensorMap expected_cases(bool numpy_only = false) {
  io::TensorMap out;
  for (const auto& c : dtype_cases()) {
    bool numpy = c.dtype != torch::kBFloat16 && c.dtype != torch::kFloat8_e4m3fn &&
                 c.dtype != torch::kFloat8_e5m2;
    if (!numpy_only || numpy) out[c.name] = expected_value(c.dtype, c.shape);
  }
  return out;
}

/// Bitwise equality including dtype and shape (torch::equal does not support every dtype).
inline ::testing::AssertionResult same_tensor(const torch::Tensor& got, const torch::Tensor& want) {
  if (got.scalar_type() != want.scalar_type() || got.sizes() != want.sizes()) {
    return ::testing::AssertionFailure() << "got " << got.scalar_type() << " " << got.sizes()
                                         << ", want " << want.scalar_type() << " " << want.sizes();
  }
  if (got.numel() == 0) return ::testing::AssertionSuccess();
  torch::Tensor a = got.contiguous().reshape({-1}).view(torch::kUInt8);  // [nbytes]
  torch::Tensor b = want.contiguous().reshape({-1}).view(torch::kUInt8);  // [nbytes]
  if (!torch::equal(a, b)) return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

inline void expect_same_maps(const io::TensorMap& got, const io::TensorMap& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, tensor] : want) {
    auto found = got.find(name);
    ASSERT_NE(found, got.end()) << "missing tensor " << name;
    EXPECT_TRUE(same_tensor(found->second, tensor)) << name;
  }
}

/// Runs tests/io/make_io_cases.py; fails the test (with the script's output) on non-zero exit.
inline ::testing::AssertionResult run_io_script(const std::string& mode, const std::string& arg) {
  std::string command = std::string("'") + DSCHAT_PYTHON + "' '" +
                        (source_dir() / "tests/io/make_io_cases.py").string() + "' " + mode + " '" +
                        arg + "'";
  std::string output;
  int rc = run_command(command, &output);
  if (rc != 0) return ::testing::AssertionFailure() << command << " exited " << rc << ":\n" << output;
  return ::testing::AssertionSuccess();
}

inline std::string read_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_bytes(const std::filesystem::path& file, const std::string& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A safetensors file from raw parts: 8-byte length of `header` (or `length_override`), the header
/// text as given (no padding), then `data`.
inline std::string safetensors_bytes(const std::string& header, const std::string& data,
                                     int64_t length_override = -1) {
  uint64_t n = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

/// The /proc/self/maps lines whose mapped file is `file` (canonical path).
inline std::vector<std::string> mappings_of(const std::filesystem::path& file) {
  std::string target = std::filesystem::weakly_canonical(file).string();
  std::ifstream maps("/proc/self/maps");
  std::vector<std::string> found;
  for (std::string line; std::getline(maps, line);) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    if (path == target || path == target + " (deleted)") found.push_back(line);
  }
  return found;
}

/// True when [ptr, ptr + n) lies in one mapping of `file` in this process.
inline bool in_mapping_of(const void* ptr, size_t n, const std::filesystem::path& file) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& line : mappings_of(file)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && p >= lo && p + n <= hi) return true;
  }
  return false;
}

}  // namespace testing
}  // namespace dschat
