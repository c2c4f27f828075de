#include "dschat/core/host_sync.h"
#include "dschat/core/random_state.h"
#include "dschat/rlhf/ppo_trainer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <chrono>
#include <random>

#include "core/stopwatch.h"
#include "core/log.h"
#include "dschat/dist/activity.h"
#include "dschat/data/collate.h"
#include "dschat/data/epoch_batches.h"
#include "dschat/data/unsupervised.h"
#include "dschat/io/state_dict.h"
#include "io/atomic_file.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/monitor/progress.h"
#include "dschat/monitor/collapse_warnings.h"
#include "rlhf/memory_hint.h"
#include "rlhf/policy_guard.h"
#include "rlhf/sample_log.h"
#include "rlhf/ppo_reports.h"
#include "dschat/rlhf/ppo_step.h"
#include "dschat/rlhf/step_runner.h"
#include "dschat/rlhf/step_setup.h"

namespace dschat {
namespace rlhf {
namespace {

namespace fs = std::filesystem;
using Clock = core::SteadyClock;
using core::seconds_since;

}  // namespace

nlohmann::json PpoResult::to_json() const {
  return {{"step_rewards", step_rewards},     {"reward_ema", reward_ema},
          {"mean_kl", mean_kl},               {"steps", steps},
          {"skipped_batches", skipped_batches}, {"generate_seconds", generate_seconds},
          {"train_seconds", train_seconds},   {"seconds", seconds},
          {"sequences_per_second", sequences_per_second}};
}

namespace {

PpoResult run_ppo_phases(const PpoConfig& config, const StepContext& context, MemoryPhase& memory) {
  const auto start = Clock::now();
  const std::string where = "step 3 (PPO)";
  const int64_t rank = context_rank(context), world = context_world(context);
  // Loading copies host tensors in: named, so the sync-debug test checks only the loop.
  std::optional<core::HostSync> setup_sync(std::in_place, "step setup (models, engines, data)");
  StepRunner runner(where, config.output_dir, config.common, context);
  DSCHAT_CHECK(!config.enable_mixed_precision_lora, Unsupported, where,
               ": enable_mixed_precision_lora (ZeRO++ quantised weights) is not implemented");
  torch::manual_seed(config.common.seed);

  auto tokenizer = load_step_tokenizer(context, config.actor_model_name_or_path);
  const int64_t pad = pad_token_of(tokenizer);
  const int64_t eos = tokenizer.eos_token_id().value_or(pad);
  const int64_t P = config.max_prompt_seq_len;
  data::PhaseData phase = data::create_prompt_dataset(
      prompt_data_options(config.data, 3, config.common.seed, P, eos_text_of(tokenizer)), tokenizer);
  data::DistributedSampler prompt_sampler(phase.train.size(), world, rank, /*shuffle=*/true, config.common.seed);
  const int64_t gen_bs = config.per_device_generation_batch_size, train_bs = config.per_device_training_batch_size;
  int64_t steps_per_epoch = (prompt_sampler.num_samples() + gen_bs - 1) / gen_bs;

  const bool mixture = !config.data.unsupervised_dataset_name.empty();
  data::TokenizedDataset unsup;
  std::optional<data::DistributedSampler> unsup_sampler;
  if (mixture) {
    data::UnsupervisedDataOptions options;
    options.paths = config.data.unsupervised_dataset_name;
    options.block_size = P + config.max_answer_seq_len;
    options.cache_dir = config.data.data_output_path;
    unsup = data::create_unsupervised_dataset(options, tokenizer);
    unsup_sampler.emplace(unsup.size(), world, rank, true, config.common.seed);
    steps_per_epoch = std::min(steps_per_epoch, (unsup_sampler->num_samples() + gen_bs - 1) / gen_bs);
  }
  const int64_t gas = config.common.gradient_accumulation_steps;
  const int64_t actor_gas = mixture ? 2 * gas : gas;  // DS-Chat doubles it: two actor backwards per micro-step
  const int64_t total_iters = static_cast<int64_t>(static_cast<double>(config.common.num_train_epochs * steps_per_epoch) *
                                                   (static_cast<double>(gen_bs) / static_cast<double>(train_bs)) *
                                                   static_cast<double>(config.ppo_epochs) / static_cast<double>(gas));
  RlhfModels models = build_rlhf_models(config, total_iters, actor_gas, context);
  const torch::Device device = models.placement.trained.device;  // the actor's and the critic's
  check_vocab(models.actor->actor()->config().vocab_size, tokenizer, config.actor_model_name_or_path);
  check_sequence_length(models.actor->actor()->config(), config.max_prompt_seq_len + config.max_answer_seq_len,
                        where + ": keys 'max_prompt_seq_len' + 'max_answer_seq_len'", config.actor_model_name_or_path);

  monitor::MetricsLog metrics(runner.log_dir(), metrics_log_options(config.common, context));
  const fs::path ckpt = runner.checkpoint_dir();
  runner.set_checkpoint_parts({"actor", "critic", "ema"});  // the actor's tags decide retention

  PpoResult result;
  GuardedRun guard(config.common.guardian, where, runner, &metrics, context.communicator);
  int64_t start_epoch = 0, skip_batches = 0, step = 0;
  bool have_reward_ema = false;
  // "batch" counts prompt batches of gen_bs per rank; generation_batches of them make a step.
  const DataLayout prompt_layout{world, gen_bs, config.generation_batches};
  // Restores the three models, the position and the reward history from a checkpoint's state (a
  // resume, or the guardian's snapshot); tag "" is the actor's latest.
  const auto restore = [&](const fs::path& dir, const std::string& tag_or_latest) {
    engine::TrainingEngine& actor_engine = models.actor->training_engine();
    const nlohmann::json state = actor_engine.load_checkpoint(dir / "actor", tag_or_latest);
    const std::string tag = state.at("tag").get<std::string>();
    models.critic_engine->load_checkpoint(dir / "critic", tag);
    load_ema_checkpoint(models, dir / "ema", tag);
    start_epoch = state.at("epoch").get<int64_t>();
    skip_batches = resume_micro_batch(state, prompt_layout, config.common.elastic_resume == "allow", where);
    step = state.at("step").get<int64_t>();
    result.reward_ema = state.at("reward_ema").get<double>();
    result.step_rewards = state.at("step_rewards").get<std::vector<double>>();
    result.skipped_batches = state.at("skipped_batches").get<int64_t>();
    have_reward_ema = step > 0;
    return state;
  };
  if (runner.prepare_resume()) {
    const nlohmann::json state = restore(ckpt, "");
    if (state.contains("guardian")) guard.guardian().load_state(guardian_state_for(state, prompt_layout));
    result.resumed = true;
    core::log_info(where, ": resuming from ", ckpt.string(), " (", state.at("tag").get<std::string>(), ") at epoch ",
                   start_epoch, ", batch ", skip_batches);
  }
  // Writes the state after prompt batch `next_batch - 1` of `epoch` under `dir` (checkpoints and
  // snapshots alike). In this order (the writer keeps it): the actor's tag, written last, decides.
  const auto save_state = [&](const fs::path& dir, const std::string& tag, int64_t epoch, int64_t next_batch,
                              engine::AsyncCheckpointWriter* background) {
    models.critic_engine->save_checkpoint(dir / "critic", tag, nlohmann::json::object(), background);
    if (models.ema && rank == 0) save_ema_checkpoint(dir / "ema", tag, module_parameters(*models.ema), background);
    nlohmann::json state = policy_position_state(epoch, next_batch, steps_per_epoch, step, guard, prompt_layout);
    state["tag"] = tag;
    state["reward_ema"] = result.reward_ema;
    state["step_rewards"] = result.step_rewards;
    state["skipped_batches"] = result.skipped_batches;
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
                         P, device);
  std::function<double()> heldout_score;
  if (heldout) {
    // The reward model's score of greedy answers to fixed prompts.
    heldout_score = [&] {
      const core::RandomStateGuard keep(device);  // watching the run does not change its random draws
      core::GenerationConfig greedy = experience_generation_config(config, eos, pad, 0);
      greedy.do_sample = false;
      std::optional<Experience> exp =
          make_experience(models, heldout->input_ids, heldout->attention_mask, greedy, pad, /*min_answer_tokens=*/0);
      return exp ? exp->reward_score.to(torch::kFloat64).mean().item<double>() : 0.0;
    };
  }

  monitor::Progress progress("PPO", config.common.num_train_epochs * steps_per_epoch, config.common.print_interval,
                    !context.progress);
  if (!result.resumed) heldout_baseline(guard, step, heldout_score);
  PpoStepReports reports(config, context, tokenizer, metrics, progress, result, have_reward_ema, guard, heldout_score);
  std::optional<Experience> last_experience;
  std::vector<Experience> exp_buffer;
  std::vector<data::SftBatch> unsup_buffer;
  bool stop_test_mode = false;
  int64_t step_first_batch = 0;
  const auto engine_skips = [&] {
    int64_t skips = 0;
    for (engine::TrainingEngine* e : {&models.actor->training_engine(), models.critic_engine.get()}) {
      if (!e->uses_loss_scaling()) skips += e->skipped_steps();
    }
    return skips;
  };
  // The guardian's look at the weights after each step (not read until the step's report).
  const auto weight_check = [&]() -> torch::Tensor {
    if (config.common.guardian.non_finite.action == monitor::GuardianAction::kOff || !config.common.guardian.enabled) {
      return {};
    }
    return models.actor->training_engine().non_finite_weight_count() +
           models.critic_engine->non_finite_weight_count().to(device);
  };
  setup_sync.reset();
  for (bool finished = false; !finished;) {
    try {
      for (int64_t epoch = start_epoch; epoch < config.common.num_train_epochs && !stop_test_mode; ++epoch) {
        data::EpochBatches<data::PromptBatch> prompts(prompt_sampler, epoch, gen_bs, false,
                                                      [&](const std::vector<int64_t>& items) {
                                                        return data::collate_prompts(phase.train, items, pad, P)
                                                            .pinned_for(device);
                                                      });
        std::optional<data::EpochBatches<data::SftBatch>> unsup_batches;
        if (mixture) {
          unsup_batches.emplace(*unsup_sampler, epoch, gen_bs, false, [&](const std::vector<int64_t>& items) {
            return data::collate_sft(unsup, items, {pad, std::nullopt}).pinned_for(device);
          });
        }
        for (int64_t batch_index = 0; batch_index < steps_per_epoch; ++batch_index) {
          auto batch = prompts.next();
          std::optional<data::SftBatch> unsup_batch;
          if (mixture) unsup_batch = unsup_batches->next();
          if (!batch || (mixture && !unsup_batch)) break;
          if (batch_index < skip_batches) continue;
          if (skipped_prompt_batch(guard.guardian(), epoch, batch_index)) continue;
          if (samples) samples->record(epoch, batch_index, step + 1, prompts.indices(batch_index));
          dist::set_activity(where + ": epoch " + std::to_string(epoch + 1) + ", prompt batch " +
                             std::to_string(batch_index) + " (step " + std::to_string(step + 1) + ")");
          const uint64_t sample_seed = config.common.seed + guard.guardian().seed_offset() +
                                       1000003ULL * static_cast<uint64_t>(rank) +
                                       static_cast<uint64_t>(epoch * steps_per_epoch + batch_index);
          memory.enter("generating and scoring experience (actor generation; actor, reference, critic and reward "
                       "forwards)",
                       MemoryAdvice::kPpoExperience);
          const data::PromptBatch prompt_batch = batch->to(device, /*non_blocking=*/true);
          std::optional<Experience> exp = make_experience(
              models, prompt_batch.input_ids, prompt_batch.attention_mask,
              experience_generation_config(config, eos, pad, sample_seed), pad, config.min_answer_tokens);
          // The batch's own size: an epoch's last batch may hold fewer prompts than gen_bs.
          reports.collapse().observe_generation(exp ? exp->rows() : 0, prompt_batch.input_ids.size(0));
          if (!exp) {
            if (!last_experience) {  // DS-Chat asserts here; we skip the batch
              ++result.skipped_batches;
              core::log_warn(where, ": every answer of batch ", batch_index, " was too short (< ", config.min_answer_tokens,
                            " tokens); skipped");
              continue;
            }
            core::log_warn(where, ": every answer was too short; reusing the previous batch's experience");
            exp = last_experience;
          }
          last_experience = exp;
          if (exp_buffer.empty()) step_first_batch = batch_index;
          if (config.print_answers && rank == 0 && step % config.print_answers_interval == 0) {
            core::HostSync sync("statistics (print_answers, on request)");
            const std::vector<std::string> answers =
                decode_answers(exp->seq.slice(0, 0, std::min<int64_t>(exp->rows(), 4)), P, tokenizer);
            for (size_t i = 0; i < answers.size(); ++i) core::log_info("--- answer ", i, ": ", answers[i]);
          }
          exp_buffer.push_back(*exp);
          // Copied now, while the experience is scored; train_unsupervised finds it in place.
          if (unsup_batch) unsup_buffer.push_back(unsup_batch->to(device, /*non_blocking=*/true));
          if (static_cast<int64_t>(exp_buffer.size()) < config.generation_batches) continue;

          // Training phase: generation_batches experiences cut into training micro-batches.
          const auto train_start = Clock::now();
          const int64_t skips_before = engine_skips();
          double generate_seconds = 0.0;
          int64_t sequences = 0;
          std::vector<Experience> micro;
          for (const Experience& e : exp_buffer) {
            generate_seconds += e.generate_seconds;
            sequences += e.rows();
            for (int64_t b = 0; b < e.rows(); b += train_bs) micro.push_back(e.slice(b, std::min(e.rows(), b + train_bs)));
          }
          std::vector<data::SftBatch> unsup_micro = unsup_buffer;
          std::mt19937_64 shuffle_rng(config.common.seed + static_cast<uint64_t>(step));
          PpoStatsQueue& stats = reports.stats();
          stats.begin_step();
          memory.enter("training the actor and critic", MemoryAdvice::kPpoTrain);
          for (int64_t ppo_epoch = 0; ppo_epoch < config.ppo_epochs; ++ppo_epoch) {
            for (size_t i = 0; i < micro.size(); ++i) {
              stats.add(train_rlhf(models, micro[i], config.constants, config.common.compute_fp32_loss,
                                   config.align_overflow));
              if (mixture && i < unsup_micro.size()) {
                stats.add_unsupervised(train_unsupervised(models, unsup_micro[i], config.data.unsup_coef));
              }
              if (models.ema) update_ema(models, kEmaBeta);
            }
            std::shuffle(micro.begin(), micro.end(), shuffle_rng);
            std::shuffle(unsup_micro.begin(), unsup_micro.end(), shuffle_rng);
          }
          exp_buffer.clear();
          unsup_buffer.clear();
          const double train_seconds = seconds_since(train_start);
          ++step;

          result.generate_seconds += generate_seconds;
          result.train_seconds += train_seconds;
          reports.step_ended(PendingPpoStep{epoch, step, epoch * steps_per_epoch + batch_index + 1, generate_seconds,
                                            train_seconds, sequences, last_experience->seq,
                                            last_experience->prompt_length, step_first_batch, batch_index + 1,
                                            engine_skips() - skips_before, weight_check()});
          // The statistics are read (one wait for the device) when the step prints; checkpoints and
          // the end read the rest.
          // The guardian checks every step before a snapshot or a checkpoint holds it.
          if ((config.common.print_interval > 0 && step % config.common.print_interval == 0) ||
              guard.snapshot_due(step) || runner.checkpoint_due(step)) {
            reports.read();
          }
          if (config.enable_test_mode && step >= config.test_stop_step) stop_test_mode = true;
          // No accumulation window open in either engine (is_gradient_accumulation_boundary() asks
          // about the next micro-step, which a closed window of GAS > 1 never is).
          const auto window_closed = [](engine::TrainingEngine& e) {
            return e.micro_steps() % e.config().gradient_accumulation_steps == 0;
          };
          const bool at_boundary =
              window_closed(models.actor->training_engine()) && window_closed(*models.critic_engine);
          if (!at_boundary) continue;
          if (guard.snapshot_due(step)) snapshot(epoch, batch_index + 1, /*confirmed=*/false);
          runner.after_optimizer_step(step, [&](engine::AsyncCheckpointWriter* background) {
            reports.read();  // the state below holds the reward history
            save_state(ckpt, "global_step" + std::to_string(step), epoch, batch_index + 1, background);
          });
          if (stop_test_mode) break;
        }
        skip_batches = 0;
      }
      reports.read();  // the last steps' statistics, checked before the models are saved
      finished = true;
    } catch (const GuardianAlarm& alarm) {
      exp_buffer.clear();
      unsup_buffer.clear();
      last_experience.reset();
      stop_test_mode = false;
      answer_guardian_alarm(
          alarm, guard, runner,
          [&](const fs::path& dir, const std::string& tag) {
            restore(dir, tag);
            if (samples) samples->rewind(step, {{"event", "rollback"}});
            reports.restart(have_reward_ema);
          },
          {&models.actor->training_engine(), models.critic_engine.get()},
          [&](engine::AsyncCheckpointWriter* background) {
            save_state(ckpt, "global_step" + std::to_string(step), alarm.skipped.value("epoch", int64_t{0}),
                       alarm.skipped.value("end", int64_t{0}), background);
          },
          config.common.seed);
    }
  }
  core::HostSync end_sync("step end (evaluation, save)");
  runner.wait_for_checkpoints();  // committed before the models are written (as in steps 1 and 2)
  reports.read();
  progress.finish();
  result.steps = step;
  result.seconds = seconds_since(start);
  result.sequences_per_second =
      result.generate_seconds + result.train_seconds > 0.0
          ? static_cast<double>(step * gen_bs * config.generation_batches * world) /
                (result.generate_seconds + result.train_seconds)
          : 0.0;

  save_rl_outputs(models, tokenizer, config.output_dir, result.to_json(), context);
  guard.finish();
  runner.finish();
  return result;
}

}  // namespace

PpoResult run_ppo(const PpoConfig& config, const StepContext& context) {
  MemoryPhase memory{"step 3 (PPO)", "actor " + config.actor_model_name_or_path + ", critic " +
                                         config.critic_model_name_or_path,
                     "loading the actor, reference, critic and reward models"};
  return with_memory_hint(memory, [&] { return run_ppo_phases(config, context, memory); });
}

}  // namespace rlhf
}  // namespace dschat
