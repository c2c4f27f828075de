#pragma once
// Helpers shared by the tests: paths of the source tree and fixtures, temp dirs, tensor checks.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include <string>

#include "dschat/core/error.h"
#include "test_paths.h"  // DSCHAT_SOURCE_DIR, DSCHAT_CLI_PATH, ...

namespace dschat {
namespace testing {

inline std::filesystem::path source_dir() { return DSCHAT_SOURCE_DIR; }
inline std::filesystem::path fixture_dir() { return DSCHAT_TEST_DATA_DIR; }
inline std::filesystem::path fixture(const std::string& name) { return fixture_dir() / name; }

/// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// Runs a shell command, returns its exit status; stdout+stderr captured into `output`.
int run_command(const std::string& command, std::string* output = nullptr);

/// Runs `script` with the project venv's Python (DSCHAT_PYTHON), passing the path of a JSON file
/// the script must write, and returns that JSON. A failing script fails the calling test (its
/// output is reported) and yields an empty array.
nlohmann::json run_python_json(const std::string& script);

/// max |a - b| over all elements (both converted to float64 on CPU).
double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b);

}  // namespace testing
}  // namespace dschat

/// EXPECT that `stmt` throws `ExcType` whose what() contains `fragment`.
#define EXPECT_THROW_WITH(stmt, ExcType, fragment)                                     \
  do {                                                                                 \
    try {                                                                              \
      stmt;                                                                            \
      ADD_FAILURE() << "expected " #ExcType " containing '" << (fragment) << "'";       \
    } catch (const ExcType& e) {                                                       \
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)               \
          << "message was: " << e.what();                                              \
    }                                                                                  \
  } while (0)
