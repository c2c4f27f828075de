#include "dschat/core/host_sync.h"
#include "dschat/rlhf/ppo_trainer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <chrono>
#include <random>

#include "core/stopwatch.h"
#include "core/log.h"
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
#include "dschat/rlhf/ppo_step.h"
#include "dschat/rlhf/step_runner.h"
#include "dschat/rlhf/step_setup.h"

namespace dschat {
namespace rlhf {
namespace {

namespace fs = std::filesystem;
using Clock = core::SteadyClock;
using core::seconds_since;

// The answers of sequences [B, L] after their prompt columns as text, special tokens skipped
// (the repeated-answer check): one copy of the answer block to the host.
std::vector<std::string> decode_answers(const torch::Tensor& seq, int64_t prompt_length,
                                        const tokenizer::Tokenizer& tokenizer) {
  torch::Tensor answers = seq.slice(1, prompt_length).to(torch::kCPU).contiguous();  // [B, N]
  std::vector<std::string> out;
  for (int64_t i = 0; i < answers.size(0); ++i) {
    const int64_t* ids = answers[i].data_ptr<int64_t>();
    out.push_back(tokenizer.decode(std::vector<int64_t>(ids, ids + answers.size(1)), true));
  }
  return out;
}

// Removes every "global_step*" entry of `dir` except `keep` (the checkpoints of earlier steps).
// What a PPO step knows on the host when it ends; its statistics wait in the PpoStatsQueue.
struct PendingPpoStep {
  int64_t epoch = 0, step = 0;
  int64_t progress_done = 0;  // prompt batches of the run done (the progress display's count)
  double generate_seconds = 0.0, train_seconds = 0.0;
  int64_t sequences = 0;      // trained on this rank
  torch::Tensor last_seq;     // [B, L] the last experience's sequences (the repeated-answer check)
  int64_t prompt_length = 0;
  int64_t first_batch = 0, end_batch = 0;  // the step's prompt batches of its epoch: [first, end)
  int64_t skipped_engine_steps = 0;        // actor and critic steps skipped for non-finite gradients
};

// The step reports of step 3 (log lines, metrics rows, collapse warnings, the progress display,
// the result's reward history), written when the statistics are read: every print_interval
// steps, before a checkpoint and at the end. Each step's lines and rows are those an immediate
// read would have written; all-reduced as before, so every rank must read at the same steps.
class PpoStepReports {
 public:
  PpoStepReports(const PpoConfig& config, const StepContext& context, const tokenizer::Tokenizer& tokenizer,
                 monitor::MetricsLog& metrics, monitor::Progress& progress, PpoResult& result, bool have_reward_ema,
                 GuardedRun& guard, std::function<double()> heldout_score)
      : config_(config), context_(context), tokenizer_(tokenizer), metrics_(metrics), progress_(progress),
        result_(result), have_reward_ema_(have_reward_ema), guard_(guard), heldout_score_(std::move(heldout_score)),
        collapse_(config.max_answer_seq_len, config.min_answer_tokens) {}

  PpoStatsQueue& stats() { return stats_; }
  // After a rollback: the unread statistics belong to the abandoned steps.
  void restart(bool have_reward_ema) {
    stats_.read();
    pending_.clear();
    have_reward_ema_ = have_reward_ema;
  }
  monitor::CollapseWatch& collapse() { return collapse_; }
  void step_ended(PendingPpoStep step) { pending_.push_back(std::move(step)); }

  // The one read of the queued statistics, then each pending step's report in order, each
  // checked by the guardian (a stop or rollback throws PolicyAlarm, the later steps unreported).
  void read() {
    if (pending_.empty()) return;
    core::HostSync sync("statistics (every print_interval)");
    const std::vector<PpoStepMeans> means = stats_.read();
    const std::vector<PendingPpoStep> pending = std::move(pending_);
    pending_.clear();
    DSCHAT_CHECK(means.size() == pending.size(), InvalidArgument, "PPO: ", means.size(), " steps of statistics for ",
                 pending.size(), " steps");
    for (size_t i = 0; i < means.size(); ++i) report(pending[i], means[i]);
  }

 private:
  void report(const PendingPpoStep& p, const PpoStepMeans& m) {
    const double reward = all_reduce_mean(context_, m.mean_reward);
    result_.reward_ema = have_reward_ema_ ? 0.9 * result_.reward_ema + 0.1 * reward : reward;
    have_reward_ema_ = true;
    result_.step_rewards.push_back(reward);
    result_.mean_kl = all_reduce_mean(context_, m.kl);
    const double actor_loss = all_reduce_mean(context_, m.actor_loss);
    const double critic_loss = all_reduce_mean(context_, m.critic_loss);
    const double unsup_loss = all_reduce_mean(context_, m.unsup_loss);
    const double answer_len = all_reduce_mean(context_, m.mean_answer_tokens);
    const int64_t world = context_world(context_);
    const double seconds = p.generate_seconds + p.train_seconds;
    const double seqs_per_second = static_cast<double>(p.sequences * world) / seconds;
    const int64_t print_interval = config_.common.print_interval;
    if (context_rank(context_) == 0 && print_interval > 0 && p.step % print_interval == 0) {
      core::log_info("Epoch: ", p.epoch, " | Step: ", p.step, " | PPO Epoch: ", config_.ppo_epochs,
                     " | Actor Loss: ", actor_loss, " | Critic Loss: ", critic_loss,
                     " | Unsupervised Loss: ", unsup_loss);
      core::log_info("End-to-End => Latency: ", seconds, "s, Generation: ", p.generate_seconds,
                     "s, Training: ", p.train_seconds, "s, Samples/sec: ", seqs_per_second,
                     ", Batch Size: ", p.sequences * world, ", Answer length: ", answer_len);
      core::log_info("Average reward score: ", reward, " | EMA reward score: ", result_.reward_ema,
                     " | KL: ", result_.mean_kl);
    }
    const bool mixture = !config_.data.unsupervised_dataset_name.empty();
    metrics_.write("ppo", p.step, {{"reward", reward},
                                   {"reward_ema", result_.reward_ema},
                                   {"kl", result_.mean_kl},
                                   {"actor_loss", actor_loss},
                                   {"critic_loss", critic_loss},
                                   {"unsup_loss", mixture ? unsup_loss : std::nan("")},
                                   {"actor_clip_frac", all_reduce_mean(context_, m.actor_clip_fraction)},
                                   {"critic_clip_frac", all_reduce_mean(context_, m.critic_clip_fraction)},
                                   {"answer_len", answer_len},
                                   {"gen_seconds", p.generate_seconds},
                                   {"train_seconds", p.train_seconds},
                                   {"seqs_per_sec", seqs_per_second}});
    const std::vector<std::string> answers = decode_answers(p.last_seq, p.prompt_length, tokenizer_);
    collapse_.observe_step(answer_len, result_.mean_kl, answers);
    progress_.update(p.progress_done, "reward " + std::to_string(reward) + ", kl " + std::to_string(result_.mean_kl));

    monitor::StepFigures health;
    health.step = p.step;
    // The value loss is positive, so a spike is measurable; a non-finite actor loss is reported too.
    health.loss = std::isfinite(actor_loss) ? critic_loss : actor_loss;
    if (p.skipped_engine_steps > 0) health.grad_norm = -1.0;
    health.kl = result_.mean_kl;
    health.entropy = all_reduce_mean(context_, m.entropy);
    health.mean_answer_tokens = answer_len;
    health.min_answer_tokens = config_.min_answer_tokens;
    health.max_answer_tokens = config_.max_answer_seq_len;
    health.repeated_share = all_reduce_mean(context_, repeated_answer_share(answers));
    health.reward = reward;
    check_policy_step(guard_, health, heldout_score_,
                      {{"epoch", p.epoch}, {"begin", p.first_batch}, {"end", p.end_batch}});
  }

  const PpoConfig& config_;
  const StepContext& context_;
  const tokenizer::Tokenizer& tokenizer_;
  monitor::MetricsLog& metrics_;
  monitor::Progress& progress_;
  PpoResult& result_;
  bool have_reward_ema_;
  GuardedRun& guard_;
  std::function<double()> heldout_score_;  // empty: no held-out check
  monitor::CollapseWatch collapse_;
  PpoStatsQueue stats_;
  std::vector<PendingPpoStep> pending_;
};

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

  monitor::MetricsLog metrics(runner.log_dir(), metrics_log_options(config.common, context));
  const fs::path ckpt = runner.checkpoint_dir();
  runner.set_checkpoint_parts({"actor", "critic", "ema"});  // the actor's tags decide retention

  PpoResult result;
  GuardedRun guard(config.common.guardian, where, runner, &metrics, context.communicator);
  int64_t start_epoch = 0, skip_batches = 0, step = 0;
  bool have_reward_ema = false;
  // Restores the three models, the position and the reward history from a checkpoint's state (a
  // resume, or the guardian's snapshot); tag "" is the actor's latest.
  const auto restore = [&](const fs::path& dir, const std::string& tag_or_latest) {
    engine::TrainingEngine& actor_engine = models.actor->training_engine();
    const nlohmann::json state = actor_engine.load_checkpoint(dir / "actor", tag_or_latest);
    const std::string tag = state.at("tag").get<std::string>();
    models.critic_engine->load_checkpoint(dir / "critic", tag);
    load_ema_checkpoint(models, dir / "ema", tag);
    start_epoch = state.at("epoch").get<int64_t>();
    skip_batches = state.at("batch").get<int64_t>();
    step = state.at("step").get<int64_t>();
    result.reward_ema = state.at("reward_ema").get<double>();
    result.step_rewards = state.at("step_rewards").get<std::vector<double>>();
    result.skipped_batches = state.at("skipped_batches").get<int64_t>();
    have_reward_ema = step > 0;
    return state;
  };
  if (runner.prepare_resume()) {
    const nlohmann::json state = restore(ckpt, "");
    if (state.contains("guardian")) guard.guardian().load_state(state.at("guardian"));
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
    const bool epoch_done = next_batch >= steps_per_epoch;
    nlohmann::json state = {{"tag", tag},
                            {"epoch", epoch_done ? epoch + 1 : epoch},
                            {"batch", epoch_done ? 0 : next_batch},
                            {"step", step},
                            {"reward_ema", result.reward_ema},
                            {"step_rewards", result.step_rewards},
                            {"skipped_batches", result.skipped_batches},
                            {"guardian", guard.guardian().state()}};
    models.actor->training_engine().save_checkpoint(dir / "actor", tag, state, background);
  };
  const auto snapshot = [&](int64_t epoch, int64_t next_batch, bool confirmed) {
    guard.take_snapshot(
        step, [&](const fs::path& dir, const std::string& tag) { save_state(dir, tag, epoch, next_batch, nullptr); },
        confirmed);
  };
  guard.set_confirmation_lag(1);  // a step's figures judge the weights of the step before
  if (guard.snapshot_due(step)) snapshot(start_epoch, skip_batches, /*confirmed=*/true);
  const monitor::GuardianConfig& guardian_config = config.common.guardian;
  std::function<double()> heldout_score;
  std::optional<data::PromptBatch> heldout;
  if (guardian_config.enabled && guardian_config.heldout_interval > 0) {
    heldout = heldout_prompt_batch(phase.eval, phase.train, guardian_config.heldout_prompts, pad, P, device);
  }
  if (heldout) {
    // The reward model's score of greedy answers to fixed prompts.
    heldout_score = [&] {
      core::GenerationConfig greedy = experience_generation_config(config, eos, pad, 0);
      greedy.do_sample = false;
      std::optional<Experience> exp =
          make_experience(models, heldout->input_ids, heldout->attention_mask, greedy, pad, /*min_answer_tokens=*/0);
      return exp ? exp->reward_score.to(torch::kFloat64).mean().item<double>() : 0.0;
    };
  }

  monitor::Progress progress("PPO", config.common.num_train_epochs * steps_per_epoch, config.common.print_interval,
                    !context.progress);
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
                                            engine_skips() - skips_before});
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
    } catch (const PolicyAlarm& alarm) {
      exp_buffer.clear();
      unsup_buffer.clear();
      last_experience.reset();
      stop_test_mode = false;
      const bool rolled_back =
          alarm.action == monitor::GuardianAction::kRollback &&
          guard.roll_back(alarm.step, alarm.cause, alarm.skipped,
                          [&](const fs::path& dir, const std::string& tag) {
                            restore(dir, tag);
                            reports.restart(have_reward_ema);
                          },
                          {&models.actor->training_engine(), models.critic_engine.get()});
      if (!rolled_back) {
        stop_for_guardian(runner, guard, alarm, [&](engine::AsyncCheckpointWriter* background) {
          save_state(ckpt, "global_step" + std::to_string(step), alarm.skipped.value("epoch", int64_t{0}),
                     alarm.skipped.value("end", int64_t{0}), background);
        });
      }
      runner.supersede_checkpoints_after(models.actor->training_engine().global_steps());
      if (guardian_config.reseed) torch::manual_seed(config.common.seed + guard.guardian().seed_offset());
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
