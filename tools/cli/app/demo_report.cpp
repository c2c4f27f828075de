#include "app/demo_report.h"

#include <cstdio>
#include <fstream>
#include <set>

#include "dschat/core/json_file.h"
#include "dschat/data/demo_task.h"
#include "dschat/inference/generate_text.h"
#include "dschat/models/load_save.h"
#include "dschat/rlhf/reward_loss.h"
#include "dschat/rlhf/step_setup.h"

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

ModelScores score_model(const std::string& model_dir, const tokenizer::Tokenizer& tokenizer,
                        models::ValueHeadModel& reward, const std::vector<std::string>& prompts,
                        const PpoConfig& step3) {
  models::CausalLM model = models::load_causal_lm(model_dir, {});
  core::GenerationConfig greedy;
  greedy.max_new_tokens = step3.max_answer_seq_len;
  ModelScores scores;
  scores.answers = answer_all(model, tokenizer, prompts, greedy);
  const int64_t pad = pad_token_of(tokenizer);
  for (size_t i = 0; i < prompts.size(); ++i) {
    scores.task += data::demo_task_score(prompts[i], scores.answers[i]);
    scores.reward += reward_of(reward, tokenizer, prompts[i], scores.answers[i], pad);
  }
  scores.task /= static_cast<double>(prompts.size());
  scores.reward /= static_cast<double>(prompts.size());

  // The policy PPO optimises is the sampling one: kSamplesPerPrompt answers per prompt at the
  // step-3 sampling settings, from a fixed seed.
  core::GenerationConfig sampling = greedy;
  sampling.do_sample = true;
  sampling.temperature = step3.sampling.temperature;
  sampling.top_k = step3.sampling.top_k;
  sampling.top_p = step3.sampling.top_p;
  sampling.seed = step3.common.seed;
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
  if (s.contains("step2")) {
    report.rm_accuracy_before = s["step2"]["before"].value("accuracy", 0.0);
    report.rm_accuracy_after = s["step2"]["after"].value("accuracy", 0.0);
  }
  const std::vector<std::string> prompts = distinct_prompts(eval_file);
  DSCHAT_CHECK(!prompts.empty(), InvalidArgument, eval_file.string(), ": no prompts");
  report.prompts = static_cast<int64_t>(prompts.size());
  auto tokenizer = tokenizer::Tokenizer::load(config.tokenizer.empty() ? config.step1.output_dir : config.tokenizer);
  models::ValueHeadModel reward = models::load_value_model(config.step2.output_dir, {});
  const ModelScores sft = score_model(config.step1.output_dir, tokenizer, reward, prompts, config.step3);
  const ModelScores ppo =
      score_model((fs::path(config.step3.output_dir) / "actor").string(), tokenizer, reward, prompts, config.step3);
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
  char text[2048];
  std::snprintf(text, sizeof(text),
                "\n"
                "  dschat demo: SFT -> reward model -> PPO on held-out prompts (%lld)\n"
                "  ---------------------------------------------------------------\n"
                "  step 1  SFT eval loss            %8.3f -> %8.3f\n"
                "  step 2  reward model accuracy    %8.3f -> %8.3f\n"
                "  step 3  mean reward   SFT model  %8.3f    PPO model %8.3f\n"
                "          task score    SFT model  %8.3f    PPO model %8.3f   (greedy: share of exactly right answers)\n"
                "          task score    SFT model  %8.3f    PPO model %8.3f   (sampled as in step 3, %lld per prompt)\n"
                "  ---------------------------------------------------------------\n"
                "  sample (PPO model): %s %s\n",
                static_cast<long long>(r.prompts), r.sft_eval_loss_before, r.sft_eval_loss_after, r.rm_accuracy_before,
                r.rm_accuracy_after, r.sft_mean_reward, r.ppo_mean_reward, r.sft_task_score, r.ppo_task_score,
                r.sft_sampled_task_score, r.ppo_sampled_task_score, static_cast<long long>(r.samples_per_prompt),
                r.sample_prompt.c_str(), r.sample_answer.c_str());
  return text;
}

}  // namespace app
}  // namespace dschat
