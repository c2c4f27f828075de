#pragma once
// Where the critic-free step's rewards come from (GrpoConfig::rewards): each answer is scored by
// every configured source and the sources' scores are combined with their weights.
//   reward_model  a step-2 reward model's score of the whole sequence (as PPO's reward)
//   exact_match   1 when the answer's final answer equals the record's reference answer after
//                 normalisation (final_answer, normalize_answer), else 0
//   regex         1 when the whole answer (trimmed) matches the pattern, else 0: a format check
//   demo_task     the embedded demo's ground truth (data/demo_task.h)
//   command       an external program (reward_program.h), started once
//   callback      a C++ function the caller registered under the source's name
// Any failure (a program's bad answer, a callback's wrong count or non-finite value, a record
// without a reference answer) throws before the batch's update, naming the source.
//
//   rlhf::RewardCallbacks callbacks{{"length", [](const std::vector<rlhf::RewardQuery>& q) {...}}};
//   rlhf::RewardSources sources(config.rewards, callbacks, load_reward_model);
//   torch::Tensor per_source = sources.score(queries, seq, mask, prompt_length);  // [N, F]
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "dschat/rlhf/setup/experience.h"
#include "dschat/rlhf/rewards/reward_program.h"
#include "dschat/rlhf/config/reward_source_config.h"

namespace dschat {
namespace rlhf {

/// The answer an exact match compares: the text after the last "####" (GSM8K's convention), else
/// the contents of the last "\boxed{...}", else the whole text; then normalize_answer.
std::string final_answer(std::string_view text);
/// Lower case, whitespace collapsed to single spaces and trimmed, then a trailing period, the
/// "," of digit groups ("1,000") and a leading "$" removed.
std::string normalize_answer(std::string_view text);
/// 1 when final_answer(response) == final_answer(reference) and is not empty, else 0.
double exact_match_reward(std::string_view response, std::string_view reference);
/// 1 when the trimmed response matches `pattern` entirely, else 0.
double regex_reward(const std::regex& pattern, std::string_view response);

class RewardSources {
 public:
  /// Builds the reward function of a reward_model source (the trainer loads the model where its
  /// step places it).
  using ModelLoader = std::function<RewardFunction(const RewardSourceConfig&)>;

  /// Starts the command sources' programs. Throws core::ConfigError for an empty list or a
  /// callback name that `callbacks` lacks (naming the registered ones), what RewardProgram
  /// throws for a program that cannot start.
  RewardSources(std::vector<RewardSourceConfig> configs, const RewardCallbacks& callbacks,
                const ModelLoader& load_model = nullptr);
  ~RewardSources();
  RewardSources(const RewardSources&) = delete;
  RewardSources& operator=(const RewardSources&) = delete;

  int64_t size() const { return static_cast<int64_t>(configs_.size()); }
  const RewardSourceConfig& config(int64_t f) const { return configs_.at(static_cast<size_t>(f)); }
  /// [F] float32: each source's weight.
  torch::Tensor weights() const;
  /// [N, F] float32 on the CPU: source f's score of answer n. queries: the decoded prompt and
  /// answer of each row of seq [N, L] (prompt_length P columns of prompt), with the record's meta.
  torch::Tensor score(const std::vector<RewardQuery>& queries, const torch::Tensor& seq,
                      const torch::Tensor& attention_mask, int64_t prompt_length);

 private:
  std::vector<double> score_source(size_t f, const std::vector<RewardQuery>& queries, const torch::Tensor& seq,
                                   const torch::Tensor& attention_mask, int64_t prompt_length);

  std::vector<RewardSourceConfig> configs_;
  std::vector<RewardCallback> callbacks_;                 // per source (callback sources)
  std::vector<RewardFunction> models_;                    // per source (reward_model sources)
  std::vector<std::unique_ptr<RewardProgram>> programs_;  // per source (command sources)
  std::vector<std::unique_ptr<std::regex>> patterns_;     // per source (regex sources)
};

}  // namespace rlhf
}  // namespace dschat
