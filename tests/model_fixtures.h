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
  static const std::vector<std::string> names = {
      "opt-preln",           "opt-postln",          "llama-gqa",     "llama-rope-llama3-tied",
      "gpt2",                "gpt-neo-local",       "gptj-partial-rotary", "codegen",
      "gpt-neox-parallel",   "gpt-neox-sequential", "bloom",         "qwen2-tied",
      "qwen3",               "mistral-window"};
  return names;
}

/// One fixture per distinct code path, for the suites that start processes (each fixture costs
/// seconds there): OPT pre/post-LN, LLaMA, GPT-2 (Conv1D, fused q/k/v), GPT-J (parallel block,
/// interleaved rotary), GPT-NeoX sequential, BLOOM (ALiBi over sharded heads), Qwen3 (q/k norm),
/// Mistral (sliding window).
inline const std::vector<std::string>& process_model_fixtures() {
  static const std::vector<std::string> names = {"opt-preln", "opt-postln", "llama-gqa", "gpt2",
                                                 "gptj-partial-rotary", "gpt-neox-sequential", "bloom",
                                                 "qwen3", "mistral-window"};
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
