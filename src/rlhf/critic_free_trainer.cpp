#include "dschat/rlhf/critic_free_trainer.h"

#include <algorithm>
#include <random>
#include <unordered_map>

#include "core/log.h"
#include "dschat/dist/activity.h"
#include "core/stopwatch.h"
#include "dschat/core/host_sync.h"
#include "dschat/core/random_state.h"
#include "dschat/data/collate.h"
#include "dschat/data/epoch_batches.h"
#include "dschat/io/state_dict.h"
#include "io/atomic_file.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/monitor/progress.h"
#include "dschat/rlhf/reward_sources.h"
#include "dschat/rlhf/rlhf_models.h"
#include "dschat/rlhf/step_runner.h"
#include "dschat/rlhf/step_setup.h"
#include "rlhf/critic_free_step.h"
#include "rlhf/critic_free_support.h"
#include "rlhf/memory_hint.h"
#include "rlhf/policy_guard.h"
#include "rlhf/sample_log.h"

namespace dschat {
namespace rlhf {
namespace {

namespace fs = std::filesystem;
using Clock = core::SteadyClock;
using core::seconds_since;

// The optimizer windows of one pass: for each micro-batch, the answer tokens of its window of
// gradient_accumulation_steps micro-batches summed over every rank (one all-reduce per pass).
std::vector<double> window_tokens(const std::vector<torch::Tensor>& micro, const CriticFreeBatch& batch, int64_t gas,
                                  const StepContext& context) {
  const int64_t windows = (static_cast<int64_t>(micro.size()) + gas - 1) / gas;
  torch::Tensor sums = torch::zeros({windows}, torch::kFloat64);  // [W]
  for (size_t i = 0; i < micro.size(); ++i) {
    double tokens = 0.0;
    for (int64_t r : host_indices(micro[i])) tokens += static_cast<double>(batch.answer_tokens.at(static_cast<size_t>(r)));
    sums[static_cast<int64_t>(i) / gas] += tokens;
  }
  if (context.communicator && context.communicator->world_size() > 1) context.communicator->all_reduce(sums);
  std::vector<double> out;
  for (size_t i = 0; i < micro.size(); ++i) out.push_back(sums[static_cast<int64_t>(i) / gas].item<double>());
  return out;
}

GrpoResult run_grpo_phases(const GrpoConfig& config, const StepContext& context) {
  const auto start = Clock::now();
  const std::string where = "step 2 (" + config.advantage_estimator + ")";
  const int64_t rank = context_rank(context), world = context_world(context);
  std::optional<core::HostSync> setup_sync(std::in_place, "step setup (models, engines, data)");
  StepRunner runner(where, config.output_dir, config.common, context);
  torch::manual_seed(config.common.seed);

  auto tokenizer = load_step_tokenizer(context, config.actor_model_name_or_path);
  const int64_t pad = pad_token_of(tokenizer);
  const int64_t eos = tokenizer.eos_token_id().value_or(pad);
  const int64_t p_len = config.max_prompt_seq_len, n = config.n_samples_per_prompt;
  data::PhaseData phase = data::create_prompt_dataset(
      prompt_data_options(config.data, 3, config.common.seed, p_len, eos_text_of(tokenizer)), tokenizer);
  data::DistributedSampler sampler(phase.train.size(), world, rank, /*shuffle=*/true, config.common.seed);
  const int64_t gen_bs = config.per_device_generation_batch_size, train_bs = config.per_device_training_batch_size;
  const int64_t steps_per_epoch = (sampler.num_samples() + gen_bs - 1) / gen_bs;
  const int64_t gas = config.common.gradient_accumulation_steps;
  const int64_t micro_per_step = (gen_bs * n + train_bs - 1) / train_bs;
  // An optimizer window must not straddle two steps: its token count (token-mean) and the
  // checkpoint after each step both assume every pass ends on an accumulation boundary.
  DSCHAT_CHECK(micro_per_step % gas == 0, ConfigError, where, ": gradient_accumulation_steps ", gas,
               " must divide the micro-batches of a pass, ", micro_per_step, " (n_samples_per_prompt ", n,
               " x per_device_generation_batch_size ", gen_bs, " answers in micro-batches of ", train_bs, ")");
  const int64_t total_iters =
      std::max<int64_t>(1, config.common.num_train_epochs * steps_per_epoch * config.ppo_epochs * micro_per_step / gas);
  const PpoConfig view = policy_view(config);
  RlhfModels models = build_policy_models(view, total_iters, gas, context, config.kl_coef > 0.0, where);
  const torch::Device device = models.placement.trained.device;
  check_vocab(models.actor->actor()->config().vocab_size, tokenizer, config.actor_model_name_or_path);
  check_sequence_length(models.actor->actor()->config(), config.max_prompt_seq_len + config.max_answer_seq_len,
                        where + ": keys 'max_prompt_seq_len' + 'max_answer_seq_len'", config.actor_model_name_or_path);
  ScoredReward reward(config, context, models.placement, tokenizer, pad);

  monitor::MetricsLog metrics(runner.log_dir(), metrics_log_options(config.common, context));
  const fs::path ckpt = runner.checkpoint_dir();
  runner.set_checkpoint_parts({"actor", "ema"});

  GrpoResult result;
  GuardedRun guard(config.common.guardian, where, runner, &metrics, context.communicator);
  int64_t start_epoch = 0, skip_batches = 0, step = 0;
  // "batch" counts prompt batches of gen_bs per rank (a step takes as many as its pool needs).
  const DataLayout prompt_layout{world, gen_bs, 1};
  // Restores the position and the result's history from a checkpoint's state (a resume, or the
  // guardian's snapshot).
  const auto restore = [&](const fs::path& dir, const std::string& tag_or_latest) {
    const nlohmann::json state = models.actor->training_engine().load_checkpoint(dir / "actor", tag_or_latest);
    const std::string tag = state.at("tag").get<std::string>();
    load_ema_checkpoint(models, dir / "ema", tag);
    start_epoch = state.at("epoch").get<int64_t>();
    skip_batches = resume_micro_batch(state, prompt_layout, config.common.elastic_resume == "allow", where);
    step = state.at("step").get<int64_t>();
    result.step_rewards = state.at("step_rewards").get<std::vector<double>>();
    result.step_group_std = state.at("step_group_std").get<std::vector<double>>();
    result.dropped_groups = state.at("dropped_groups").get<int64_t>();
    return state;
  };
  if (runner.prepare_resume()) {
    const nlohmann::json state = restore(ckpt, "");
    if (state.contains("guardian")) guard.guardian().load_state(guardian_state_for(state, prompt_layout));
    result.resumed = true;
    core::log_info(where, ": resuming from ", ckpt.string(), " (", state.at("tag").get<std::string>(), ") at epoch ",
                   start_epoch, ", batch ", skip_batches);
  }
  // Writes the state after prompt batch `batch_index` of `epoch` (the next position) under `dir`.
  const auto save_state = [&](const fs::path& dir, const std::string& tag, int64_t epoch, int64_t next_batch,
                              engine::AsyncCheckpointWriter* background) {
    if (models.ema && rank == 0) save_ema_checkpoint(dir / "ema", tag, module_parameters(*models.ema), background);
    nlohmann::json state = policy_position_state(epoch, next_batch, steps_per_epoch, step, guard, prompt_layout);
    state["tag"] = tag;
    state["step_rewards"] = result.step_rewards;
    state["step_group_std"] = result.step_group_std;
    state["dropped_groups"] = result.dropped_groups;
    models.actor->training_engine().save_checkpoint(dir / "actor", tag, state, background);
  };
  const auto snapshot = [&](int64_t epoch, int64_t next_batch, bool confirmed) {
    guard.take_snapshot(
        step, [&](const fs::path& dir, const std::string& tag) { save_state(dir, tag, epoch, next_batch, nullptr); },
        confirmed);
  };
  std::optional<SampleLog> samples = open_policy_sample_log(
      config.common.log_sample_ids, runner.log_dir(), context.communicator, result.resumed, step, prompt_layout.to_json());
  const std::optional<data::PromptBatch> heldout =
      start_policy_guard(guard, step, [&](bool confirmed) { snapshot(start_epoch, skip_batches, confirmed); }, phase, pad,
                         p_len, device);
  std::function<double()> heldout_check;  // the guardian's held-out score; empty: none
  if (heldout) {
    heldout_check = [&] {
      const core::RandomStateGuard keep(device);  // watching the run does not change its random draws
      return heldout_score(models, reward, config, *heldout, eos, pad, config.common.guardian.heldout_source);
    };
  }
  if (!result.resumed) heldout_baseline(guard, step, heldout_check);

  monitor::Progress progress(where, config.common.num_train_epochs * steps_per_epoch, config.common.print_interval,
                             !context.progress);
  const torch::Tensor weights = reward.sources().weights();  // [F]
  std::vector<CriticFreeBatch> pool;  // dynamic sampling: this step's batches so far
  int64_t pool_batches = 0, pool_first = 0;
  setup_sync.reset();
  for (bool finished = false; !finished;) {
    try {
      for (int64_t epoch = start_epoch; epoch < config.common.num_train_epochs; ++epoch) {
        data::EpochBatches<data::PromptBatch> prompts(sampler, epoch, gen_bs, false, [&](const std::vector<int64_t>& items) {
          return data::collate_prompts(phase.train, items, pad, p_len).pinned_for(device);
        });
        pool.clear();
        pool_batches = 0;
        for (int64_t batch_index = 0; batch_index < steps_per_epoch; ++batch_index) {
          auto host_batch = prompts.next();
          if (!host_batch) break;
          if (batch_index < skip_batches) continue;
          if (skipped_prompt_batch(guard.guardian(), epoch, batch_index)) continue;
          if (samples) samples->record(epoch, batch_index, step + 1, prompts.indices(batch_index));
          dist::set_activity(where + ": epoch " + std::to_string(epoch + 1) + ", prompt batch " +
                             std::to_string(batch_index) + " (step " + std::to_string(step + 1) + ")");
          const uint64_t sample_seed = config.common.seed + guard.guardian().seed_offset() +
                                       1000003ULL * static_cast<uint64_t>(rank) +
                                       static_cast<uint64_t>(epoch * steps_per_epoch + batch_index);
          const data::PromptBatch batch = host_batch->to(device, /*non_blocking=*/true);
          if (pool.empty()) pool_first = batch_index;
          pool.push_back(sample_and_score(models, reward, config, batch, eos, pad, sample_seed));
          ++pool_batches;
          const std::optional<StepAnswers> ready =
              take_step_answers(pool, pool_batches, config, weights, gen_bs, pad, context);
          if (!ready) continue;
          pool.clear();
          pool_batches = 0;
          result.dropped_groups += ready->dropped_groups;
          CriticFreeBatch answers = ready->batch;
          compute_advantages(config, weights, answers, context);
          if (config.print_answers && rank == 0 && step % config.print_answers_interval == 0) {
            print_answers(answers, reward, weights);
          }

          const auto train_start = Clock::now();
          const int64_t skipped_before = models.actor->training_engine().skipped_steps();
          std::vector<CriticFreeMicroStats> micro_stats;
          std::mt19937_64 shuffle_rng(config.common.seed + static_cast<uint64_t>(step));
          std::vector<int64_t> order(static_cast<size_t>(answers.exp.rows()));
          for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
          for (int64_t pass = 0; pass < config.ppo_epochs; ++pass) {
            if (pass > 0) std::shuffle(order.begin(), order.end(), shuffle_rng);
            std::vector<torch::Tensor> micro;  // each [b] int64 row indices on the host
            for (size_t b = 0; b < order.size(); b += static_cast<size_t>(train_bs)) {
              const size_t e = std::min(order.size(), b + static_cast<size_t>(train_bs));
              micro.push_back(torch::tensor(std::vector<int64_t>(order.begin() + static_cast<std::ptrdiff_t>(b),
                                                                 order.begin() + static_cast<std::ptrdiff_t>(e)),
                                            torch::kInt64));
            }
            const std::vector<double> tokens = window_tokens(micro, answers, gas, context);
            for (size_t i = 0; i < micro.size(); ++i) {
              micro_stats.push_back(critic_free_micro_step(*models.actor, config, answers, micro[i], tokens[i]));
              if (models.ema) update_ema(models, kEmaBeta);
            }
          }
          const double train_seconds = seconds_since(train_start);
          ++step;
          const StepFigures f = read_step(answers, weights, n, micro_stats, ready->kept_share, context);
          result.step_rewards.push_back(f.reward);
          result.step_group_std.push_back(f.group_std);
          result.mean_kl = f.kl;
          result.mean_entropy = f.entropy;
          for (int64_t s = 0; s < reward.sources().size(); ++s) {
            result.last_source_means[reward.sources().config(s).name] = f.source_means[static_cast<size_t>(s)];
          }
          result.generate_seconds += answers.exp.generate_seconds;
          result.train_seconds += train_seconds;
          log_step(metrics, config, reward.sources(), step, epoch, f, answers.exp.generate_seconds, train_seconds, rank);
          progress.update(epoch * steps_per_epoch + batch_index + 1, "reward " + std::to_string(f.reward));

          monitor::StepFigures health;
          health.step = step;
          health.loss = f.loss;
          engine::TrainingEngine& actor_engine = models.actor->training_engine();
          if (!actor_engine.uses_loss_scaling() && actor_engine.skipped_steps() > skipped_before) health.grad_norm = -1.0;
          if (config.common.guardian.enabled && config.common.guardian.non_finite.action != monitor::GuardianAction::kOff) {
            health.non_finite_weights = actor_engine.non_finite_weight_count().item<double>();
          }
          if (config.kl_coef > 0.0) health.kl = f.kl;
          health.entropy = f.entropy;
          health.mean_answer_tokens = f.answer_tokens;
          health.max_answer_tokens = config.max_answer_seq_len;
          {
            // One answer per prompt (the first of its group): the same answer to different prompts is
            // the collapse; a group's answers agreeing is just a confident policy.
            std::vector<std::string> firsts;
            const std::vector<RewardQuery> queries = reward.queries(answers.exp.seq, answers.exp.prompt_length);
            for (size_t i = 0; i < queries.size(); i += static_cast<size_t>(n)) firsts.push_back(queries[i].response);
            health.repeated_share = guard.mean_over_ranks({repeated_answer_share(firsts)})[0];
          }
          health.reward = f.reward;
          check_policy_step(guard, health, heldout_check,
                            {{"epoch", epoch}, {"begin", pool_first}, {"end", batch_index + 1}});
          if (guard.snapshot_due(step)) snapshot(epoch, batch_index + 1, /*confirmed=*/false);
          runner.after_optimizer_step(step, [&](engine::AsyncCheckpointWriter* background) {
            save_state(ckpt, "global_step" + std::to_string(step), epoch, batch_index + 1, background);
          });
        }
        if (!pool.empty()) core::log_warn(where, ": epoch ", epoch, " ended with ", pool_batches,
                                          " sampled batches not yet a full step; they are not trained on");
        skip_batches = 0;
      }
      finished = true;
    } catch (const GuardianAlarm& alarm) {
      pool.clear();
      pool_batches = 0;
      answer_guardian_alarm(
          alarm, guard, runner, [&](const fs::path& dir, const std::string& tag) {
            restore(dir, tag);
            if (samples) samples->rewind(step, {{"event", "rollback"}});
          },
          {&models.actor->training_engine()},
          [&](engine::AsyncCheckpointWriter* background) {
            save_state(ckpt, "global_step" + std::to_string(step), alarm.skipped.value("epoch", int64_t{0}),
                       alarm.skipped.value("end", int64_t{0}), background);
          },
          config.common.seed);
    }
  }
  core::HostSync end_sync("step end (save)");
  runner.wait_for_checkpoints();
  progress.finish();
  result.steps = step;
  result.seconds = seconds_since(start);

  save_rl_outputs(models, tokenizer, config.output_dir, result.to_json(), context);
  guard.finish();
  runner.finish();
  return result;
}

}  // namespace

nlohmann::json GrpoResult::to_json() const {
  return {{"step_rewards", step_rewards},   {"step_group_std", step_group_std}, {"source_means", last_source_means},
          {"mean_kl", mean_kl},             {"mean_entropy", mean_entropy},     {"steps", steps},
          {"dropped_groups", dropped_groups}, {"generate_seconds", generate_seconds},
          {"train_seconds", train_seconds}, {"seconds", seconds}};
}

GrpoResult run_grpo(const GrpoConfig& config, const StepContext& context) {
  MemoryPhase memory{"step 2 (" + config.advantage_estimator + ")", "actor " + config.actor_model_name_or_path,
                     "loading the actor and its reference"};
  return with_memory_hint(memory, [&] { return run_grpo_phases(config, context); });
}

}  // namespace rlhf
}  // namespace dschat
