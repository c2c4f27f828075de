#pragma once
// The tiny random checkpoints (tools/make_fixtures.py) that the model-level suites run over, and
// the gtest-safe test-name suffix for each:
//   INSTANTIATE_TEST_SUITE_P(Fixtures, MySuite, ::testing::ValuesIn(testing::model_fixtures()),
//                            testing::FixtureName());

#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

namespace dschat {
namespace testing {

inline const std::vector<std::string>& model_fixtures() {
  static const std::vector<std::string> names = {"opt-preln", "opt-postln", "llama-gqa", "llama-rope-llama3-tied"};
  return names;
}

/// "llama-rope-llama3-tied" -> "llama_rope_llama3_tied".
struct FixtureName {
  std::string operator()(const ::testing::TestParamInfo<std::string>& info) const {
    std::string name = info.param;
    for (auto& ch : name) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
    return name;
  }
};

}  // namespace testing
}  // namespace dschat
