#include "app/demo_report.h"

#include <cstdio>
#include <fstream>
#include <optional>
#include <set>

#include "dschat/core/json_file.h"
#include "dschat/data/demo_task.h"
#include "dschat/inference/generate_text.h"
#include "dschat/models/load_save.h"
#include "dschat/rlhf/math/reward_loss.h"
#include "dschat/rlhf/setup/step_setup.h"

namespace dschat {
namespace app {
using namespace rlhf;
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSamplesPerPrompt = 64;

std::vector<std::string> distinct_prompts(const fs::path& file) {
  std::ifstream in(file);
  DSCHAT_CHECK(in.good(), NotFound, file.string(), ": cannot open the demo's held-out prompts");
  std::vector<std::string> prompts;
  std::set<std::string> seen;
  int64_t line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    const nlohmann::json record = core::parse_json_text(line, file.string() + ":" + std::to_string(line_number));
    const std::string prompt = record.at("prompt").get<std::string>();
    if (seen.insert(prompt).second) prompts.push_back(prompt);
  }
  return prompts;
}

// The reward model's end score of " prompt answer<eos>" (the text step 3 scores).
double reward_of(models::ValueHeadModel& reward, const tokenizer::Tokenizer& tokenizer, const std::string& prompt,
                 const std::string& answer, int64_t pad) {
  std::vector<int64_t> prompt_ids = tokenizer.encode(" " + prompt, true);
  std::vector<int64_t> ids = prompt_ids;
  for (int64_t id : tokenizer.encode(answer, false)) ids.push_back(id);
  ids.push_back(tokenizer.eos_token_id().value_or(pad));
  torch::Tensor seq = torch::tensor(ids, torch::kInt64).unsqueeze(0);  // [1, T]
  torch::NoGradGuard no_grad;
  torch::Tensor values = reward->forward(seq, torch::ones_like(seq)).to(torch::kFloat32);  // [1, T]
  // The answer's last token, before the eos (the position step 3's end score reads).
  return values[0][seq.size(1) - 2].item<double>();
}

struct ModelScores {
  double task = 0.0, reward = 0.0;  // greedy answers
  double sampled_task = 0.0;        // answers sampled as step 3 samples them
  std::vector<std::string> answers;
};

std::vector<std::string> answer_all(models::CausalLM& model, const tokenizer::Tokenizer& tokenizer,
                                    const std::vector<std::string>& prompts, core::GenerationConfig generation) {
  std::vector<std::string> padded;
  for (const std::string& p : prompts) padded.push_back(" " + p);
  std::vector<std::string> answers;
  const uint64_t seed = generation.seed;
  for (size_t begin = 0; begin < padded.size(); begin += 64) {
    std::vector<std::string> chunk(padded.begin() + begin, padded.begin() + std::min(padded.size(), begin + 64));
    generation.seed = seed + begin;  // a fixed stream per chunk: the same draws for the SFT and PPO models
    for (std::string& answer : inference::generate_text(model, tokenizer, chunk, generation)) {
      answers.push_back(std::move(answer));
    }
  }
  return answers;
}

// How the RL step sampled its answers (step 3's or the critic-free step's settings).
struct RlSampling {
  ExperienceSampling sampling;
  int64_t max_answer_seq_len = 0;
  uint32_t seed = 0;
};

// reward: the step-2 reward model's scores of the greedy answers (null: not scored).
ModelScores score_model(const std::string& model_dir, const tokenizer::Tokenizer& tokenizer,
                        models::ValueHeadModel* reward, const std::vector<std::string>& prompts,
                        const RlSampling& rl) {
  models::CausalLM model = models::load_causal_lm(model_dir, {});
  core::GenerationConfig greedy;
  greedy.max_new_tokens = rl.max_answer_seq_len;
  ModelScores scores;
  scores.answers = answer_all(model, tokenizer, prompts, greedy);
  const int64_t pad = pad_token_of(tokenizer);
  for (size_t i = 0; i < prompts.size(); ++i) {
    scores.task += data::demo_task_score(prompts[i], scores.answers[i]);
    if (reward != nullptr) scores.reward += reward_of(*reward, tokenizer, prompts[i], scores.answers[i], pad);
  }
  scores.task /= static_cast<double>(prompts.size());
  scores.reward /= static_cast<double>(prompts.size());

  // The policy RL optimises is the sampling one: kSamplesPerPrompt answers per prompt at the
  // RL step's sampling settings, from a fixed seed.
  core::GenerationConfig sampling = greedy;
  sampling.do_sample = true;
  sampling.temperature = rl.sampling.temperature;
  sampling.top_k = rl.sampling.top_k;
  sampling.top_p = rl.sampling.top_p;
  sampling.seed = rl.seed;
  std::vector<std::string> repeated;
  for (int64_t s = 0; s < kSamplesPerPrompt; ++s) repeated.insert(repeated.end(), prompts.begin(), prompts.end());
  const std::vector<std::string> sampled = answer_all(model, tokenizer, repeated, sampling);
  for (size_t i = 0; i < repeated.size(); ++i) scores.sampled_task += data::demo_task_score(repeated[i], sampled[i]);
  scores.sampled_task /= static_cast<double>(repeated.size());
  return scores;
}

}  // namespace

DemoReport evaluate_demo(const PipelineConfig& config, const PipelineResult& result, const fs::path& eval_file) {
  DemoReport report;
  const nlohmann::json& s = result.summaries;
  if (s.contains("step1")) {
    report.sft_eval_loss_before = s["step1"].value("eval_loss_before", 0.0);
    report.sft_eval_loss_after = s["step1"].value("eval_loss_after", 0.0);
  }
  if (s.contains("step2") && !config.critic_free()) {
    report.rm_accuracy_before = s["step2"]["before"].value("accuracy", 0.0);
    report.rm_accuracy_after = s["step2"]["after"].value("accuracy", 0.0);
  }
  const std::vector<std::string> prompts = distinct_prompts(eval_file);
  DSCHAT_CHECK(!prompts.empty(), InvalidArgument, eval_file.string(), ": no prompts");
  report.prompts = static_cast<int64_t>(prompts.size());
  auto tokenizer = tokenizer::Tokenizer::load(config.tokenizer.empty() ? config.step1.output_dir : config.tokenizer);
  // The critic-free pipelines have no reward model: the demo task's checker was their reward.
  const bool critic_free = config.critic_free();
  report.policy = critic_free ? "GRPO" : "PPO";
  const rlhf::AdvantageEstimator estimator = config.step2_grpo.advantage_estimator;
  if (critic_free && estimator == rlhf::AdvantageEstimator::kRloo) report.policy = "RLOO";
  if (critic_free && (estimator == rlhf::AdvantageEstimator::kReinforcePp ||
                      estimator == rlhf::AdvantageEstimator::kReinforcePpBaseline)) {
    report.policy = "REINFORCE++";
  }
  report.reward_model = !critic_free;
  std::optional<models::ValueHeadModel> reward;
  if (!critic_free) reward = models::load_value_model(config.step2.output_dir, {});
  const RlSampling rl = critic_free ? RlSampling{config.step2_grpo.sampling, config.step2_grpo.max_answer_seq_len,
                                                 config.step2_grpo.common.seed}
                                    : RlSampling{config.step3.sampling, config.step3.max_answer_seq_len,
                                                 config.step3.common.seed};
  const std::string policy_dir =
      (fs::path(critic_free ? config.step2_grpo.output_dir : config.step3.output_dir) / "actor").string();
  models::ValueHeadModel* scorer = reward ? &*reward : nullptr;
  const ModelScores sft = score_model(config.step1.output_dir, tokenizer, scorer, prompts, rl);
  const ModelScores ppo = score_model(policy_dir, tokenizer, scorer, prompts, rl);
  report.sft_task_score = sft.task;
  report.ppo_task_score = ppo.task;
  report.sft_sampled_task_score = sft.sampled_task;
  report.ppo_sampled_task_score = ppo.sampled_task;
  report.samples_per_prompt = kSamplesPerPrompt;
  report.sft_mean_reward = sft.reward;
  report.ppo_mean_reward = ppo.reward;
  report.sample_prompt = prompts.front();
  report.sample_answer = ppo.answers.front();
  return report;
}

std::string format_demo_report(const DemoReport& r) {
  const char* p = r.policy.c_str();
  char text[3072];
  int used = std::snprintf(text, sizeof(text),
                           "\n"
                           "  dschat demo: SFT -> %s on held-out prompts (%lld)\n"
                           "  ---------------------------------------------------------------\n"
                           "  step 1  SFT eval loss            %8.3f -> %8.3f\n",
                           r.reward_model ? "reward model -> PPO" : p, static_cast<long long>(r.prompts),
                           r.sft_eval_loss_before, r.sft_eval_loss_after);
  if (r.reward_model) {
    used += std::snprintf(text + used, sizeof(text) - used,
                          "  step 2  reward model accuracy    %8.3f -> %8.3f\n"
                          "  step 3  mean reward   SFT model  %8.3f    %s model %8.3f\n",
                          r.rm_accuracy_before, r.rm_accuracy_after, r.sft_mean_reward, p, r.ppo_mean_reward);
  } else {
    used += std::snprintf(text + used, sizeof(text) - used,
                          "  step 2  %s, rewarded by the demo task's checker (no reward model)\n", p);
  }
  std::snprintf(text + used, sizeof(text) - used,
                "          task score    SFT model  %8.3f    %s model %8.3f   (greedy: share of exactly right answers)\n"
                "          task score    SFT model  %8.3f    %s model %8.3f   (sampled as in training, %lld per prompt)\n"
                "  ---------------------------------------------------------------\n"
                "  sample (%s model): %s %s\n",
                r.sft_task_score, p, r.ppo_task_score, r.sft_sampled_task_score, p, r.ppo_sampled_task_score,
                static_cast<long long>(r.samples_per_prompt), p, r.sample_prompt.c_str(), r.sample_answer.c_str());
  return text;
}

}  // namespace app
}  // namespace dschat
