#include "test_util.h"

#include <ftw.h>

#include <array>
#include <fstream>
#include <cstdio>
#include <random>

namespace dschat {
namespace testing {

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() /
          ("dschat_test_" + std::to_string(rd()) + "_" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

// nftw instead of std::filesystem::remove_all: libtorch.so exports its own copy of the
// std::filesystem symbols, and its remove_all crashes (null call) when it wins symbol resolution.
TempDir::~TempDir() {
  nftw(
      path_.c_str(),
      [](const char* file, const struct stat*, int, struct FTW*) { return ::remove(file); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

int run_command(const std::string& command, std::string* output) {
  std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::array<char, 4096> buffer{};
  std::string text;
  size_t n = 0;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) text.append(buffer.data(), n);
  int status = pclose(pipe);
  if (output != nullptr) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes()) return std::numeric_limits<double>::infinity();
  if (a.numel() == 0) return 0.0;
  return (a.to(torch::kCPU, torch::kFloat64) - b.to(torch::kCPU, torch::kFloat64)).abs().max().item<double>();
}

nlohmann::json run_python_json(const std::string& script) {
  TempDir tmp;
  std::ofstream(tmp / "oracle.py") << script;
  std::string out;
  const int status =
      run_command(std::string(DSCHAT_PYTHON) + " " + (tmp / "oracle.py").string() + " " + (tmp / "out.json").string(), &out);
  EXPECT_EQ(status, 0) << out;
  if (status != 0) return nlohmann::json::array();
  return nlohmann::json::parse(std::ifstream(tmp / "out.json"));
}

}  // namespace testing
}  // namespace dschat
