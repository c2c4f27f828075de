// The critic-free step's reward sources (rlhf/rewards/reward_sources.h): the built-in verifiers' answer
// normalisation, each source type scoring a batch, weights, and the errors that stop a step
// (an unregistered callback, a wrong count, a non-finite reward, a record without a reference).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "dschat/core/error.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/rewards/reward_sources.h"
#include "test_util.h"

namespace dschat {
namespace {

using rlhf::RewardQuery;
using rlhf::RewardSourceConfig;

TEST(RewardVerifiers, FinalAnswerNormalisation) {
  EXPECT_EQ(rlhf::normalize_answer("  The   Answer.\n"), "the answer");
  EXPECT_EQ(rlhf::normalize_answer("$1,000"), "1000");
  EXPECT_EQ(rlhf::normalize_answer("a, b"), "a, b");  // not a digit group
  EXPECT_EQ(rlhf::final_answer("so 3 + 4 = 7\n#### 7"), "7");
  EXPECT_EQ(rlhf::final_answer("thus \\boxed{\\frac{1}{2}} and \\boxed{42}."), "42");
  EXPECT_EQ(rlhf::final_answer("it is \\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");
  EXPECT_EQ(rlhf::final_answer(" Seven. "), "seven");
  EXPECT_EQ(rlhf::exact_match_reward("The answer is\n#### 1,234.", "#### 1234"), 1.0);
  EXPECT_EQ(rlhf::exact_match_reward("1235", "1234"), 0.0);
  EXPECT_EQ(rlhf::exact_match_reward("", ""), 0.0);  // an empty reference matches nothing
  const std::regex digit("[0-9]");
  EXPECT_EQ(rlhf::regex_reward(digit, " 7\n"), 1.0);
  EXPECT_EQ(rlhf::regex_reward(digit, "7 7"), 0.0);  // the whole answer must match
}

std::vector<RewardQuery> demo_queries() {
  return {{"Human: What is 3 plus 4? Assistant:", " 7", {{"chosen", "7"}}},
          {"Human: What is 3 plus 4? Assistant:", " 8", {{"chosen", "7"}}},
          {"Human: Repeat the word: apple. Assistant:", " apple apple", {{"chosen", "apple"}}}};
}

torch::Tensor score(rlhf::RewardSources& sources, const std::vector<RewardQuery>& q) {
  const torch::Tensor seq = torch::zeros({static_cast<int64_t>(q.size()), 4}, torch::kInt64);  // [N, L]
  return sources.score(q, seq, torch::ones_like(seq), 2);
}

TEST(RewardSources, EachBuiltInSourceAndACallbackScoreEveryAnswer) {
  std::vector<RewardSourceConfig> configs(4);
  configs[0].type = rlhf::RewardSourceType::kDemoTask;
  configs[0].name = "demo_task";
  configs[1].type = rlhf::RewardSourceType::kExactMatch;
  configs[1].name = "exact_match";
  configs[2].type = rlhf::RewardSourceType::kRegex;
  configs[2].name = "regex";
  configs[2].pattern = "[a-z0-9]+";
  configs[2].weight = 0.25;
  configs[3].type = rlhf::RewardSourceType::kCallback;
  configs[3].name = "length";
  configs[3].weight = -0.5;
  rlhf::RewardCallbacks callbacks{{"length", [](const std::vector<RewardQuery>& q) {
                                     std::vector<double> out;
                                     for (const auto& x : q) out.push_back(static_cast<double>(x.response.size()));
                                     return out;
                                   }}};
  rlhf::RewardSources sources(configs, callbacks);
  const torch::Tensor s = score(sources, demo_queries());  // [3, 4]
  const torch::Tensor expected = torch::tensor({1.f, 1.f, 1.f, 2.f,    // " 7": right, format ok
                                                0.f, 0.f, 1.f, 2.f,    // " 8": wrong value
                                                0.f, 0.f, 0.f, 12.f})  // doubled word: wrong, bad format
                                     .view({3, 4});
  EXPECT_TRUE(torch::equal(s, expected)) << s;
  EXPECT_TRUE(torch::equal(sources.weights(), torch::tensor({1.f, 1.f, 0.25f, -0.5f})));
}

TEST(RewardSources, ACommandSourceIsAProgramFedJsonLines) {
  testing::TempDir tmp;
  const auto file = tmp / "verify.py";
  std::ofstream(file) << "import json, sys\n"
                         "for line in sys.stdin:\n"
                         "    q = json.loads(line)\n"
                         "    ok = q['response'].strip() == q['meta']['chosen']\n"
                         "    print(json.dumps({'reward': 1.0 if ok else -1.0}), flush=True)\n";
  RewardSourceConfig c;
  c.type = rlhf::RewardSourceType::kCommand;
  c.name = "verify";
  c.argv = {DSCHAT_PYTHON, file.string()};
  rlhf::RewardSources sources({c}, {});
  EXPECT_TRUE(torch::equal(score(sources, demo_queries()), torch::tensor({1.f, -1.f, -1.f}).view({3, 1})));
}

TEST(RewardSources, ErrorsNameTheSource) {
  RewardSourceConfig callback;
  callback.type = rlhf::RewardSourceType::kCallback;
  callback.name = "mine";
  EXPECT_THROW_WITH(rlhf::RewardSources({callback}, {{"other", nullptr}}), core::ConfigError,
                    "no callback is registered under the name 'mine' (registered: other)");
  rlhf::RewardSources short_answer({callback}, {{"mine", [](const std::vector<RewardQuery>&) {
                                                   return std::vector<double>{1.0};
                                                 }}});
  EXPECT_THROW_WITH(score(short_answer, demo_queries()), core::InvalidArgument,
                    "reward source 'mine' (callback) returned 1 rewards for 3 answers");
  rlhf::RewardSources nan_answer({callback}, {{"mine", [](const std::vector<RewardQuery>& q) {
                                                 return std::vector<double>(q.size(), std::nan(""));
                                               }}});
  EXPECT_THROW_WITH(score(nan_answer, demo_queries()), core::InvalidArgument, "returned nan for answer 0");
  RewardSourceConfig exact;
  exact.type = rlhf::RewardSourceType::kExactMatch;
  exact.name = "exact_match";
  rlhf::RewardSources no_reference({exact}, {});
  EXPECT_THROW_WITH(score(no_reference, {{"Human: hi Assistant:", " hello", {}}}), core::InvalidArgument,
                    "has no reference answer");
  EXPECT_THROW_WITH(rlhf::RewardSources({}, {}), core::ConfigError, "at least one reward source");
}

TEST(RewardSources, ConfigEntriesAreChecked) {
  const nlohmann::json good = nlohmann::json::parse(
      R"([{"type": "exact_match"}, {"type": "regex", "pattern": "[0-9]", "weight": 0.1, "name": "format"},
          {"type": "command", "argv": ["python3", "v.py"], "timeout_seconds": 5}])");
  const auto sources = rlhf::parse_reward_sources(good, "f.json: rewards");
  ASSERT_EQ(sources.size(), 3u);
  EXPECT_EQ(sources[1].name, "format");
  EXPECT_DOUBLE_EQ(sources[1].weight, 0.1);
  EXPECT_EQ(sources[2].argv, (std::vector<std::string>{"python3", "v.py"}));
  EXPECT_DOUBLE_EQ(sources[2].timeout_seconds, 5.0);
  auto parse = [](const std::string& text) { return rlhf::parse_reward_sources(nlohmann::json::parse(text), "f.json: rewards"); };
  EXPECT_THROW_WITH(parse(R"([{"type": "oracle"}])"), core::ConfigError, "'oracle' is not one of");
  EXPECT_THROW_WITH(parse(R"([{"type": "regex", "pattern": "[0-9"}])"), core::ConfigError, "not a valid regular expression");
  EXPECT_THROW_WITH(parse(R"([{"type": "command"}])"), core::ConfigError, "f.json: rewards[0]: key 'argv' is required");
  EXPECT_THROW_WITH(parse(R"([{"type": "callback"}])"), core::ConfigError, "key 'name' is required");
  EXPECT_THROW_WITH(parse(R"([{"type": "reward_model"}])"), core::ConfigError, "key 'model' is required");
  EXPECT_THROW_WITH(parse(R"([{"type": "demo_task"}, {"type": "demo_task"}])"), core::ConfigError,
                    "rewards[1]: the name 'demo_task' is used twice");
  EXPECT_THROW_WITH(parse(R"([{"type": "demo_task", "wieght": 2}])"), core::ConfigError, "weight");
  EXPECT_THROW_WITH(parse(R"({"type": "demo_task"})"), core::ConfigError, "must be an array");
}

TEST(GrpoConfig, EstimatorDefaultsAndChecks) {
  using rlhf::parse_grpo_config;
  const rlhf::GrpoConfig grpo = parse_grpo_config(nlohmann::json::object(), "f.json: step2_grpo");
  EXPECT_EQ(grpo.advantage_estimator, rlhf::AdvantageEstimator::kGrpo);
  EXPECT_EQ(grpo.n_samples_per_prompt, 8);
  EXPECT_EQ(grpo.kl_coef, 0.0);
  EXPECT_EQ(grpo.kl_mode, rlhf::KlMode::kLoss);
  EXPECT_EQ(grpo.kl_estimator, rlhf::KlEstimator::kK3);
  EXPECT_EQ(grpo.loss_aggregation, rlhf::LossAggregation::kTokenMean);
  EXPECT_DOUBLE_EQ(grpo.actor.learning_rate, 1e-6);
  EXPECT_TRUE(grpo.sampling.do_sample);
  const rlhf::GrpoConfig rloo = parse_grpo_config(nlohmann::json::object(), "f.json", {}, "rloo");
  EXPECT_EQ(rloo.n_samples_per_prompt, 2);
  EXPECT_DOUBLE_EQ(rloo.kl_coef, 0.05);
  EXPECT_EQ(rloo.kl_mode, rlhf::KlMode::kReward);
  EXPECT_EQ(rloo.kl_estimator, rlhf::KlEstimator::kK1);
  EXPECT_EQ(rloo.loss_aggregation, rlhf::LossAggregation::kSequenceMean);
  const rlhf::GrpoConfig rpp = parse_grpo_config({{"advantage_estimator", "reinforce_pp_baseline"}}, "f.json", {},
                                                 "reinforce_pp");
  EXPECT_DOUBLE_EQ(rpp.kl_coef, 0.01);
  EXPECT_EQ(rpp.n_samples_per_prompt, 4);
  EXPECT_THROW_WITH(parse_grpo_config({{"advantage_estimator", "rloo"}}, "f.json", {}, "grpo"), core::ConfigError,
                    "contradicts the pipeline");
  EXPECT_THROW_WITH(parse_grpo_config({{"loss_aggregation", "token-mean"}}, "f.json", {}, "rloo"), core::ConfigError,
                    "only sequence-mean applies");
  EXPECT_THROW_WITH(parse_grpo_config({{"kl_mode", "loss"}}, "f.json", {}, "rloo"), core::ConfigError,
                    "KL to the reference in the reward");
  EXPECT_THROW_WITH(parse_grpo_config({{"n_samples_per_prompt", 1}}, "f.json"), core::ConfigError, ">= 2");
  EXPECT_THROW_WITH(parse_grpo_config({{"experience_sampling", {{"do_sample", false}}}}, "f.json"), core::ConfigError,
                    "do_sample must be true");
  EXPECT_THROW_WITH(parse_grpo_config({{"kl_estimater", "k1"}}, "f.json"), core::ConfigError, "kl_estimator");
  EXPECT_THROW_WITH(rlhf::parse_pipeline_config({{"pipeline", "sft-grpo"}}, "f.json"), core::ConfigError,
                    "key 'rewards' is required by the sft-grpo pipeline");
  const rlhf::PipelineConfig p = rlhf::parse_pipeline_config(
      {{"pipeline", "sft-rloo"}, {"output_dir", "o"}, {"step2_grpo", {{"rewards", {{{"type", "demo_task"}}}}}}}, "f.json");
  EXPECT_EQ(p.steps, (std::vector<int>{1, 2}));
  EXPECT_EQ(p.kind_of(2), rlhf::StepKind::kCriticFree);
  EXPECT_EQ(p.step2_grpo.advantage_estimator, rlhf::AdvantageEstimator::kRloo);
  EXPECT_EQ(p.step2_grpo.actor_model_name_or_path, "o/actor");
  EXPECT_EQ(p.output_of(2), "o/grpo");
  EXPECT_THROW_WITH(rlhf::parse_pipeline_config({{"pipeline", "sft-grpo"}, {"steps", {1, 3}}}, "f.json"),
                    core::ConfigError, "there is no step 3");
}

}  // namespace
}  // namespace dschat
