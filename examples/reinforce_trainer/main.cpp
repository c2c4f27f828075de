// A REINFORCE trainer with a leave-one-out baseline (RLOO's), written only with libdschat's public
// trainer toolkit: the policy samples n answers per prompt through a HybridEngine, a plain C++
// function scores them (the demo task's ground truth: no reward model), and the update is
//   loss = -mean_i[ (r_i - mean_{j != i} r_j) * sum_t log pi(answer_i,t) ]   over each prompt's n answers.
// The algorithm is a rlhf::PolicyAlgorithm: rlhf::PolicyLoop runs it as it runs PPO and GRPO,
// with the epochs over the prompts, resumable checkpoints, the training-health guardian
// (snapshots, rollbacks), the metrics log and the progress display. docs/toolkit.md walks through it.
//
//   reinforce_trainer MODEL_DIR DATA_DIR OUTPUT_DIR [--steps N] [--samples N] [--init random]
//                     [--checkpoint-interval N]
// MODEL_DIR holds config.json and the tokenizer files (with --init random no weights are read);
// DATA_DIR holds {train,eval}.json in the demo's {"prompt","chosen","rejected"} format. Writes
// OUTPUT_DIR/actor (the trained policy), OUTPUT_DIR/actor_logs (metrics) and, while it runs,
// OUTPUT_DIR/actor_checkpoints: run it again after an interruption and it resumes there.
#include <dschat/core/error.h>
#include <dschat/data/collate.h>
#include <dschat/data/demo_task.h>
#include <dschat/data/prompt_dataset.h>
#include <dschat/hybrid/hybrid_engine.h>
#include <dschat/models/load_save.h>
#include <dschat/monitor/metrics_log.h>
#include <dschat/rlhf/setup/experience.h>
#include <dschat/rlhf/math/log_probs.h>
#include <dschat/rlhf/loop/policy_loop.h>
#include <dschat/rlhf/setup/step_setup.h>
#include <dschat/tokenizer/tokenizer.h>

#include <iostream>
#include <string>
#include <vector>

using namespace dschat;

namespace {

struct Args {
  std::string model_dir, data_dir, output_dir;
  int64_t steps = 4, samples = 4, prompts_per_step = 8, checkpoint_interval = 1;
  bool random_init = false;
};

Args parse_args(int argc, char** argv) {
  Args args;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      DSCHAT_CHECK(i + 1 < argc, InvalidArgument, arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--steps") args.steps = std::stoll(value());
    else if (arg == "--samples") args.samples = std::stoll(value());
    else if (arg == "--init") args.random_init = value() == "random";
    else if (arg == "--checkpoint-interval") args.checkpoint_interval = std::stoll(value());
    else positional.push_back(arg);
  }
  DSCHAT_CHECK(positional.size() == 3, InvalidArgument,
               "usage: reinforce_trainer MODEL_DIR DATA_DIR OUTPUT_DIR [--steps N] [--samples N] [--init random] "
               "[--checkpoint-interval N]");
  args.model_dir = positional[0];
  args.data_dir = positional[1];
  args.output_dir = positional[2];
  DSCHAT_CHECK(args.steps > 0 && args.samples > 1, InvalidArgument, "--steps must be > 0 and --samples > 1");
  return args;
}

// The reward source: decode each answer and score it against its prompt with the task's checker.
rlhf::RewardFunction ground_truth_reward(const tokenizer::Tokenizer& tokenizer) {
  return [&tokenizer](const torch::Tensor& seq, const torch::Tensor& attention_mask, int64_t prompt_length) {
    torch::Tensor ids = seq.to(torch::kCPU);                 // [B, L]
    torch::Tensor mask = attention_mask.to(torch::kCPU);     // [B, L]
    torch::Tensor rewards = torch::zeros({seq.size(0)});     // [B]
    for (int64_t b = 0; b < seq.size(0); ++b) {
      std::vector<int64_t> prompt, answer;
      for (int64_t t = 0; t < seq.size(1); ++t) {
        if (mask[b][t].item<int64_t>() == 0) continue;
        (t < prompt_length ? prompt : answer).push_back(ids[b][t].item<int64_t>());
      }
      rewards[b] = data::demo_task_score(tokenizer.decode(prompt, true), tokenizer.decode(answer, true));
    }
    return rewards.to(seq.device());
  };
}

// RLOO's baseline: each answer's reward minus the mean of the other answers to its prompt.
// rewards: [K] float32 in groups of n adjacent rows -> [K] advantages.
torch::Tensor leave_one_out_advantages(const torch::Tensor& rewards, int64_t n) {
  torch::Tensor grouped = rewards.view({-1, n});                         // [K / n, n]
  torch::Tensor others = (grouped.sum(1, true) - grouped) / (n - 1);     // [K / n, n]
  return (grouped - others).view({-1});                                  // [K]
}

// The algorithm the PolicyLoop runs: per prompt batch, n answers per prompt and their rewards
// (collect); per step, the leave-one-out policy gradient (train). The loop checkpoints the
// policy's engine with state() beside it, and rolls back to a snapshot when the guardian sees the
// figures train() returns go wrong.
class LeaveOneOutReinforce : public rlhf::PolicyAlgorithm {
 public:
  LeaveOneOutReinforce(hybrid::HybridEngine& actor, models::CausalLM reference, const tokenizer::Tokenizer& tokenizer,
                       int64_t samples, std::string output_dir)
      : actor_(actor), tokenizer_(tokenizer), samples_(samples), output_dir_(std::move(output_dir)) {
    sources_.policy = &actor;
    sources_.reference = std::move(reference);
    sources_.reward = ground_truth_reward(tokenizer);
    const int64_t pad = rlhf::pad_token_of(tokenizer);
    options_.generation.max_new_tokens = 8;
    options_.generation.do_sample = true;
    options_.generation.num_return_sequences = samples;
    options_.generation.eos_token_id = pad;
    options_.generation.pad_token_id = pad;
    options_.pad_token_id = pad;
    options_.drop_short_answers = false;  // a prompt's n answers form its baseline
  }

  torch::Device device() const override { return actor_.actor()->parameters().front().device(); }
  std::vector<engine::TrainingEngine*> engines() override { return {&actor_.training_engine()}; }
  nlohmann::json state() const override { return {{"rewards", rewards_}}; }
  void restore(const nlohmann::json& state) override { rewards_ = state.at("rewards").get<std::vector<double>>(); }

  // The guardian's held-out check: one greedy answer to each fixed prompt, the mean reward.
  double heldout_score(const data::PromptBatch& prompts) override {
    rlhf::ExperienceOptions greedy = options_;
    greedy.generation.do_sample = false;
    greedy.generation.num_return_sequences = 1;
    std::optional<rlhf::Experience> exp =
        rlhf::generate_experience(sources_, prompts.input_ids, prompts.attention_mask, greedy);
    return exp ? exp->reward_score.mean().item<double>() : 0.0;
  }

  void start(rlhf::PolicyLoop& loop) override { loop_ = &loop; }

  rlhf::Collected collect(const data::PromptBatch& batch, const rlhf::PolicyBatch& at) override {
    options_.generation.seed = at.sample_seed;
    experience_ = rlhf::generate_experience(sources_, batch.input_ids, batch.attention_mask, options_);
    return experience_ ? rlhf::Collected::kStepReady : rlhf::Collected::kSkipped;
  }

  std::optional<monitor::StepFigures> train(const rlhf::PolicyStep& step) override {
    const rlhf::Experience& exp = *experience_;
    torch::Tensor mask = rlhf::answer_mask(exp.attention_mask, exp.prompt_length);                 // [K, L-1]
    torch::Tensor advantages = leave_one_out_advantages(exp.reward_score, samples_);               // [K]
    torch::Tensor log_probs = rlhf::sequence_log_probs(actor_.actor(), exp.seq, exp.attention_mask);  // [K, L-1]
    torch::Tensor loss = -(advantages * rlhf::masked_sum(log_probs, mask)).mean();                // []
    actor_.training_engine().backward(loss);
    actor_.training_engine().step();

    const double kl = (rlhf::masked_sum(exp.logprobs - exp.ref_logprobs, mask).sum() / mask.sum()).item<double>();
    const double reward = exp.reward_score.mean().item<double>();
    rewards_.push_back(reward);
    loop_->metrics().write("reinforce", step.step, {{"reward", reward}, {"loss", loss.item<double>()}, {"kl", kl}});
    loop_->progress().update(step.progress_done, "reward " + std::to_string(reward));
    std::cout << "step " << step.step << " | mean reward " << reward << " | loss " << loss.item<double>()
              << " | kl " << kl << " | answers " << exp.rows() << "\n";
    experience_.reset();
    monitor::StepFigures figures;  // what the guardian judges the step by
    figures.step = step.step;
    figures.loss = loss.item<double>();
    figures.kl = kl;
    figures.reward = reward;
    return figures;
  }

  void drop_collected() override { experience_.reset(); }

  void save_outputs(int64_t steps) override {
    rlhf::save_trained_model(actor_.training_engine(), actor_.actor()->config(), tokenizer_, output_dir_,
                             {{"steps", steps}, {"step_rewards", rewards_}}, loop_->context());
  }

 private:
  hybrid::HybridEngine& actor_;
  const tokenizer::Tokenizer& tokenizer_;
  int64_t samples_;
  std::string output_dir_;
  rlhf::ExperienceSources sources_;
  rlhf::ExperienceOptions options_;
  rlhf::PolicyLoop* loop_ = nullptr;
  std::optional<rlhf::Experience> experience_;  // the step's answers, until train()
  std::vector<double> rewards_;                  // each step's mean reward (kept in checkpoints)
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    torch::manual_seed(1234);
    const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::load(args.model_dir);
    const int64_t pad = rlhf::pad_token_of(tokenizer);

    // The loop: every prompt batch of phase 3's split, one step per batch, a checkpoint every
    // --checkpoint-interval steps, at most --steps steps.
    rlhf::StepContext context;  // one process; see dschat/dist for several ranks
    rlhf::PolicyLoopSettings settings;
    settings.where = "reinforce_trainer";
    settings.progress_name = "REINFORCE";
    settings.output_dir = args.output_dir + "/actor";
    settings.common.dtype = torch::kFloat32;
    settings.common.seed = 1234;
    settings.common.num_train_epochs = args.steps;  // each epoch has at least one step
    settings.common.checkpoint_interval = args.checkpoint_interval;
    settings.generation_batch_size = args.prompts_per_step;
    settings.prompt_length = 24;
    settings.stop_after_step = args.steps;
    rlhf::PolicyLoop loop(settings, context);

    // Prompts: phase 3 of DeepSpeed-Chat's data pipeline (left-padded prompt batches).
    rlhf::DataConfig data_config;
    data_config.data_path = {"local/jsonfile"};
    data_config.local_jsonfile_dir = args.data_dir;
    data_config.data_split = "0,0,10";
    data_config.data_output_path = "";  // no tokenised cache for an example
    const data::PhaseData prompts = data::create_prompt_dataset(
        rlhf::prompt_data_options(data_config, 3, settings.common.seed, settings.prompt_length,
                                  rlhf::eos_text_of(tokenizer)),
        tokenizer);
    DSCHAT_CHECK(prompts.train.size() > 0, InvalidArgument, args.data_dir, ": no prompts in the phase-3 split");
    loop.set_prompts(prompts, pad);

    // The policy in a HybridEngine (trains with the training engine, samples with the inference
    // engine), with DeepSpeed-Chat's optimizer defaults; the reference for the KL we report.
    models::LoadOptions load;
    load.random_init = args.random_init;
    models::CausalLM policy = models::load_causal_lm(args.model_dir, load);
    models::CausalLM reference = models::load_causal_lm(args.model_dir, load);
    {
      torch::NoGradGuard no_grad;
      for (auto& item : reference->named_parameters()) item.value().copy_(policy->named_parameters()[item.key()]);
    }
    rlhf::ModelTrainingConfig model_config;
    model_config.learning_rate = 1e-4;
    engine::HybridEngineConfig hybrid_config;
    hybrid_config.max_out_tokens = settings.prompt_length + 8;
    hybrid::HybridEngineOptions options;
    options.training = rlhf::training_engine_options(
        settings.common, model_config,
        rlhf::train_ds_config(settings.common, /*zero_stage=*/0, args.prompts_per_step * args.samples, 1, 1, "example",
                              &hybrid_config),
        args.steps, context);
    hybrid::HybridEngine actor(policy, std::move(options));

    LeaveOneOutReinforce algorithm(actor, reference, tokenizer, args.samples, settings.output_dir.string());
    loop.run(algorithm);
    std::cout << "saved " << settings.output_dir.string() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "reinforce_trainer: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
