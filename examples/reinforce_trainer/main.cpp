// A REINFORCE trainer with a leave-one-out baseline (RLOO's), written only with libdschat's public
// trainer toolkit: the policy samples n answers per prompt through a HybridEngine, a plain C++
// function scores them (the demo task's ground truth: no reward model), and the update is
//   loss = -mean_i[ (r_i - mean_{j != i} r_j) * sum_t log pi(answer_i,t) ]   over each prompt's n answers.
// It shows the pieces a custom loop combines; docs/toolkit.md walks through it.
//
//   reinforce_trainer MODEL_DIR DATA_DIR OUTPUT_DIR [--steps N] [--samples N] [--init random]
// MODEL_DIR holds config.json and the tokenizer files (with --init random no weights are read);
// DATA_DIR holds {train,eval}.json in the demo's {"prompt","chosen","rejected"} format.
#include <dschat/core/error.h>
#include <dschat/data/collate.h>
#include <dschat/data/demo_task.h>
#include <dschat/data/prompt_dataset.h>
#include <dschat/hybrid/hybrid_engine.h>
#include <dschat/models/load_save.h>
#include <dschat/monitor/metrics_log.h>
#include <dschat/rlhf/experience.h>
#include <dschat/rlhf/log_probs.h>
#include <dschat/rlhf/step_setup.h>
#include <dschat/tokenizer/tokenizer.h>

#include <iostream>
#include <string>
#include <vector>

using namespace dschat;

namespace {

struct Args {
  std::string model_dir, data_dir, output_dir;
  int64_t steps = 4, samples = 4, prompts_per_step = 8;
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
    else positional.push_back(arg);
  }
  DSCHAT_CHECK(positional.size() == 3, InvalidArgument,
               "usage: reinforce_trainer MODEL_DIR DATA_DIR OUTPUT_DIR [--steps N] [--samples N] [--init random]");
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

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    torch::manual_seed(1234);
    const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::load(args.model_dir);
    const int64_t pad = rlhf::pad_token_of(tokenizer);

    // Prompts: phase 3 of DeepSpeed-Chat's data pipeline (left-padded prompt batches).
    rlhf::DataConfig data_config;
    data_config.data_path = {"local/jsonfile"};
    data_config.local_jsonfile_dir = args.data_dir;
    data_config.data_split = "0,0,10";
    data_config.data_output_path = "";  // no tokenised cache for an example
    const int64_t prompt_length = 24;
    data::PhaseData prompts = data::create_prompt_dataset(
        rlhf::prompt_data_options(data_config, 3, 1234, prompt_length, rlhf::eos_text_of(tokenizer)), tokenizer);

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
    rlhf::CommonStepConfig common;
    common.dtype = "fp32";
    rlhf::ModelTrainingConfig model_config;
    model_config.learning_rate = 1e-4;
    rlhf::StepContext context;  // one process; see dschat/dist for several ranks
    engine::HybridEngineConfig hybrid_config;
    hybrid_config.max_out_tokens = prompt_length + 8;
    hybrid::HybridEngineOptions options;
    options.training = rlhf::training_engine_options(
        common, model_config,
        rlhf::train_ds_config(common, /*zero_stage=*/0, args.prompts_per_step * args.samples, 1, 1, "example",
                              &hybrid_config),
        args.steps, context);
    hybrid::HybridEngine actor(policy, std::move(options));

    rlhf::ExperienceSources sources;
    sources.policy = &actor;
    sources.reference = reference;
    sources.reward = ground_truth_reward(tokenizer);
    rlhf::ExperienceOptions experience;
    experience.generation.max_new_tokens = 8;
    experience.generation.do_sample = true;
    experience.generation.num_return_sequences = args.samples;
    experience.generation.eos_token_id = pad;
    experience.generation.pad_token_id = pad;
    experience.pad_token_id = pad;
    experience.drop_short_answers = false;  // a prompt's n answers form its baseline

    monitor::MetricsLog metrics(args.output_dir + "/logs");
    const int64_t available = prompts.train.size();
    DSCHAT_CHECK(available > 0, InvalidArgument, args.data_dir, ": no prompts in the phase-3 split");
    for (int64_t step = 0; step < args.steps; ++step) {
      std::vector<int64_t> items;
      for (int64_t i = 0; i < args.prompts_per_step; ++i) items.push_back((step * args.prompts_per_step + i) % available);
      data::PromptBatch batch = data::collate_prompts(prompts.train, items, pad, prompt_length);
      experience.generation.seed = 1000 + static_cast<uint64_t>(step);
      std::optional<rlhf::Experience> exp =
          rlhf::generate_experience(sources, batch.input_ids, batch.attention_mask, experience);
      if (!exp) continue;

      torch::Tensor mask = rlhf::answer_mask(exp->attention_mask, exp->prompt_length);           // [K, L-1]
      torch::Tensor advantages = leave_one_out_advantages(exp->reward_score, args.samples);      // [K]
      torch::Tensor log_probs = rlhf::sequence_log_probs(actor.actor(), exp->seq, exp->attention_mask);  // [K, L-1]
      torch::Tensor loss = -(advantages * rlhf::masked_sum(log_probs, mask)).mean();            // []
      actor.training_engine().backward(loss);
      actor.training_engine().step();

      const double kl = (rlhf::masked_sum(exp->logprobs - exp->ref_logprobs, mask).sum() / mask.sum()).item<double>();
      const double reward = exp->reward_score.mean().item<double>();
      metrics.write("reinforce", step + 1, {{"reward", reward}, {"loss", loss.item<double>()}, {"kl", kl}});
      std::cout << "step " << step + 1 << " | mean reward " << reward << " | loss " << loss.item<double>()
                << " | kl " << kl << " | answers " << exp->rows() << "\n";
    }
    rlhf::save_trained_model(actor.training_engine(), policy->config(), tokenizer, args.output_dir + "/actor",
                             {{"steps", args.steps}}, context);
    std::cout << "saved " << args.output_dir << "/actor\n";
  } catch (const std::exception& e) {
    std::cerr << "reinforce_trainer: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
