#include "dschat/rlhf/loop/policy_loop.h"

#include <algorithm>

#include "core/log.h"
#include "dschat/core/host_sync.h"
#include "dschat/core/random_state.h"
#include "dschat/data/epoch_batches.h"
#include "dschat/dist/activity.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "rlhf/setup/data_layout.h"
#include "rlhf/loop/policy_guard.h"
#include "rlhf/setup/sample_log.h"

namespace dschat {
namespace rlhf {

namespace fs = std::filesystem;

PolicyLoop::PolicyLoop(PolicyLoopSettings settings, const StepContext& context)
    : settings_(std::move(settings)),
      context_(context),
      rank_(context_rank(context)),
      world_(context_world(context)),
      runner_(settings_.where, settings_.output_dir, settings_.common, context) {}

PolicyLoop::~PolicyLoop() = default;

void PolicyLoop::set_prompts(const data::PhaseData& phase, int64_t pad_token_id, int64_t max_batches_per_epoch) {
  phase_ = &phase;
  pad_token_id_ = pad_token_id;
  sampler_.emplace(phase.train.size(), world_, rank_, /*shuffle=*/true, settings_.common.seed);
  const int64_t gen_bs = settings_.generation_batch_size;
  steps_per_epoch_ = (sampler_->num_samples() + gen_bs - 1) / gen_bs;
  if (max_batches_per_epoch >= 0) steps_per_epoch_ = std::min(steps_per_epoch_, max_batches_per_epoch);
}

namespace {

// What a checkpoint's "batch" counts in: prompt batches of generation_batch_size per rank,
// generation_batches of them a step.
DataLayout prompt_layout(const PolicyLoopSettings& settings, int64_t world) {
  return DataLayout{world, settings.generation_batch_size, settings.generation_batches};
}

}  // namespace

void PolicyLoop::check_step(const monitor::StepFigures& figures, int64_t epoch, int64_t first_batch,
                            int64_t end_batch) {
  check_policy_step(*guard_, figures, heldout_check_, {{"epoch", epoch}, {"begin", first_batch}, {"end", end_batch}});
}

// Restores the models, the position and the algorithm's history from checkpoint `tag` under
// `dir` (a resume, or the guardian's snapshot); tag "" is the policy's latest.
nlohmann::json PolicyLoop::restore(PolicyAlgorithm& algorithm, const fs::path& dir, const std::string& tag_or_latest) {
  const DataLayout layout = prompt_layout(settings_, world_);
  const nlohmann::json state = algorithm.engines().front()->load_checkpoint(dir / "actor", tag_or_latest);
  algorithm.load_parts(dir, state.at("tag").get<std::string>());
  start_.epoch = state.at("epoch").get<int64_t>();
  start_.next_batch =
      resume_micro_batch(state, layout, settings_.common.elastic_resume_allowed, settings_.where);
  step_ = state.at("step").get<int64_t>();
  algorithm.restore(state);
  return state;
}

// Writes the state after prompt batch `position.next_batch - 1` of `position.epoch` under `dir`
// (checkpoints and snapshots alike): the other parts first, the policy's last (its tag decides).
void PolicyLoop::save_state(PolicyAlgorithm& algorithm, const fs::path& dir, const std::string& tag,
                            Position position, engine::AsyncCheckpointWriter* background) {
  algorithm.save_parts(dir, tag, background);
  const DataLayout layout = prompt_layout(settings_, world_);
  nlohmann::json state =
      policy_position_state(position.epoch, position.next_batch, steps_per_epoch_, step_, *guard_, layout);
  state["tag"] = tag;
  state.update(algorithm.state());
  algorithm.engines().front()->save_checkpoint(dir / "actor", tag, state, background);
}

void PolicyLoop::snapshot(PolicyAlgorithm& algorithm, Position position, bool confirmed) {
  guard_->take_snapshot(
      step_, [&](const fs::path& dir, const std::string& tag) { save_state(algorithm, dir, tag, position, nullptr); },
      confirmed);
}

// The setup after the models: metrics, guard, resume, sample log, held-out check, progress.
void PolicyLoop::open(PolicyAlgorithm& algorithm) {
  DSCHAT_CHECK(phase_ != nullptr, InvalidArgument, settings_.where, ": PolicyLoop::run before set_prompts");
  device_ = algorithm.device();
  metrics_ = std::make_unique<monitor::MetricsLog>(runner_.log_dir(), metrics_log_options(settings_.common, context_));
  std::vector<std::string> parts{"actor"};
  for (const std::string& part : algorithm.other_parts()) parts.push_back(part);
  runner_.set_checkpoint_parts(parts);  // the actor's tags decide retention
  guard_ = std::make_unique<GuardedRun>(settings_.common.guardian, settings_.where, runner_, metrics_.get(),
                                        context_.communicator);
  const DataLayout layout = prompt_layout(settings_, world_);
  if (runner_.prepare_resume()) {
    const nlohmann::json state = restore(algorithm, runner_.checkpoint_dir(), "");
    if (state.contains("guardian")) guard_->guardian().load_state(guardian_state_for(state, layout));
    resumed_ = true;
    core::log_info(settings_.where, ": resuming from ", runner_.checkpoint_dir().string(), " (",
                   state.at("tag").get<std::string>(), ") at epoch ", start_.epoch, ", batch ", start_.next_batch);
  }
  std::optional<SampleLog> samples = open_policy_sample_log(settings_.common.log_sample_ids, runner_.log_dir(),
                                                            context_.communicator, resumed_, step_, layout.to_json());
  if (samples) samples_ = std::make_unique<SampleLog>(std::move(*samples));
  heldout_ = start_policy_guard(
      *guard_, step_, [&](bool confirmed) { snapshot(algorithm, start_, confirmed); }, *phase_,
      pad_token_id_, settings_.prompt_length, device_);
  if (heldout_) {
    heldout_check_ = [this, &algorithm] {
      const core::RandomStateGuard keep(device_);  // watching the run does not change its random draws
      return algorithm.heldout_score(*heldout_);
    };
  }
  // The bar ends where the run does: test mode's stop_after_step steps (of generation_batches
  // prompt batches each) when that comes first.
  int64_t progress_total = settings_.common.num_train_epochs * steps_per_epoch_;
  if (settings_.stop_after_step > 0) {
    progress_total = std::min(progress_total,
                              settings_.stop_after_step * std::max<int64_t>(settings_.generation_batches, 1));
  }
  progress_ = std::make_unique<monitor::Progress>(settings_.progress_name, progress_total,
                                                  settings_.common.print_interval, !context_.progress);
  if (!resumed_) heldout_baseline(*guard_, step_, heldout_check_);
}

void PolicyLoop::run(PolicyAlgorithm& algorithm) {
  {
    core::HostSync setup_sync("step setup (models, engines, data)");
    open(algorithm);
    algorithm.start(*this);
  }
  run_epochs(algorithm);
  core::HostSync end_sync("step end (evaluation, save)");
  runner_.wait_for_checkpoints();  // committed before the models are written (as in steps 1 and 2)
  algorithm.read_reports();
  progress_->finish();
  algorithm.save_outputs(step_);
  guard_->finish();
  runner_.finish();
  phase_ = nullptr;
  heldout_check_ = nullptr;  // it refers to the algorithm, which may not outlive the run
}

// The epochs from start_, again from a snapshot's position after each rollback.
void PolicyLoop::run_epochs(PolicyAlgorithm& algorithm) {
  for (bool finished = false; !finished;) {
    try {
      for (int64_t epoch = start_.epoch; epoch < settings_.common.num_train_epochs && !stopping_; ++epoch) {
        run_epoch(algorithm, epoch);
        start_.next_batch = 0;
      }
      algorithm.read_reports();  // the last steps' statistics, checked before the models are saved
      finished = true;
    } catch (const GuardianAlarm& alarm) {
      algorithm.drop_collected();
      collected_ = 0;
      stopping_ = false;
      const fs::path ckpt = runner_.checkpoint_dir();
      answer_guardian_alarm(
          alarm, *guard_, runner_,
          [&](const fs::path& dir, const std::string& tag) {
            restore(algorithm, dir, tag);
            if (samples_) samples_->rewind(step_, {{"event", "rollback"}});
          },
          algorithm.engines(),
          [&](engine::AsyncCheckpointWriter* background) {
            save_state(algorithm, ckpt, "global_step" + std::to_string(step_),
                       {alarm.skipped.value("epoch", int64_t{0}), alarm.skipped.value("end", int64_t{0})}, background);
          },
          settings_.common.seed);
    }
  }
}

void PolicyLoop::run_epoch(PolicyAlgorithm& algorithm, int64_t epoch) {
  const int64_t gen_bs = settings_.generation_batch_size;
  data::EpochBatches<data::PromptBatch> prompts(*sampler_, epoch, gen_bs, false, [&](const std::vector<int64_t>& items) {
    return data::collate_prompts(phase_->train, items, pad_token_id_, settings_.prompt_length)
        .pinned_for(device_);
  });
  for (int64_t batch_index = 0; batch_index < steps_per_epoch_; ++batch_index) {
    std::optional<data::PromptBatch> host_batch = prompts.next();
    if (!host_batch || !algorithm.draw_companion(epoch, batch_index)) break;
    if (batch_index < start_.next_batch) continue;
    if (skipped_prompt_batch(guard_->guardian(), epoch, batch_index)) continue;
    if (samples_) samples_->record(epoch, batch_index, step_ + 1, prompts.indices(batch_index));
    dist::set_activity(settings_.where + ": epoch " + std::to_string(epoch + 1) + ", prompt batch " +
                       std::to_string(batch_index) + " (step " + std::to_string(step_ + 1) + ")");
    PolicyBatch at;
    at.epoch = epoch;
    at.index = batch_index;
    at.step = step_ + 1;
    at.sample_seed = settings_.common.seed + guard_->guardian().seed_offset() + 1000003ULL * static_cast<uint64_t>(rank_) +
                     static_cast<uint64_t>(epoch * steps_per_epoch_ + batch_index);
    const Collected collected = algorithm.collect(host_batch->to(device_, /*non_blocking=*/true), at);
    if (collected == Collected::kSkipped) continue;
    if (collected_++ == 0) first_batch_ = batch_index;
    if (collected != Collected::kStepReady) continue;
    train_step(algorithm, epoch, batch_index);
    if (stopping_ && at_accumulation_boundary(algorithm)) break;
  }
  if (!settings_.steps_span_epochs && collected_ > 0) {
    core::log_warn(settings_.where, ": epoch ", epoch, " ended with ", collected_,
                   " sampled batches not yet a full step; they are not trained on");
    algorithm.drop_collected();
    collected_ = 0;
  }
}

bool PolicyLoop::at_accumulation_boundary(PolicyAlgorithm& algorithm) {
  // No accumulation window open in any engine (is_gradient_accumulation_boundary() asks about the
  // next micro-step, which a closed window of GAS > 1 never is).
  for (engine::TrainingEngine* e : algorithm.engines()) {
    if (e->micro_steps() % e->config().gradient_accumulation_steps != 0) return false;
  }
  return true;
}

void PolicyLoop::train_step(PolicyAlgorithm& algorithm, int64_t epoch, int64_t batch_index) {
  PolicyStep step;
  step.epoch = epoch;
  step.step = step_ + 1;
  step.first_batch = first_batch_;
  step.end_batch = batch_index + 1;
  step.progress_done = epoch * steps_per_epoch_ + batch_index + 1;
  collected_ = 0;
  const std::optional<monitor::StepFigures> figures = algorithm.train(step);
  ++step_;
  if (figures) check_step(*figures, epoch, step.first_batch, step.end_batch);
  // Deferred statistics are read when the step prints, and before a snapshot or checkpoint holds it.
  const int64_t print_interval = settings_.common.print_interval;
  if ((print_interval > 0 && step_ % print_interval == 0) || guard_->snapshot_due(step_) ||
      runner_.checkpoint_due(step_)) {
    algorithm.read_reports();
  }
  if (settings_.stop_after_step > 0 && step_ >= settings_.stop_after_step) stopping_ = true;
  if (!at_accumulation_boundary(algorithm)) return;
  const Position next{epoch, batch_index + 1};
  if (guard_->snapshot_due(step_)) snapshot(algorithm, next, /*confirmed=*/false);
  runner_.after_optimizer_step(step_, [&](engine::AsyncCheckpointWriter* background) {
    algorithm.read_reports();  // the state holds the algorithm's history
    save_state(algorithm, runner_.checkpoint_dir(), "global_step" + std::to_string(step_), next, background);
  });
}

}  // namespace rlhf
}  // namespace dschat
