#include "dschat/core/host_sync.h"
#include "dschat/rlhf/loop/supervised_loop.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/stopwatch.h"
#include "core/tensor_util.h"
#include "dschat/dist/activity.h"
#include "dschat/monitor/progress.h"
#include "dschat/monitor/throughput.h"
#include "dschat/rlhf/loop/guarded_run.h"
#include "dschat/rlhf/setup/output_gate.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "rlhf/setup/data_layout.h"
#include "rlhf/loop/policy_guard.h"
#include "rlhf/setup/sample_log.h"

namespace dschat {
namespace rlhf {
namespace {

// A checkpoint's client state: the trainer's keys, the data position a resume skips to and the
// guardian's state.
// The layout the engine trains with: its ranks, micro-batch rows and accumulation steps.
DataLayout layout_of(const engine::TrainingEngine& engine) {
  return {engine.communicator() ? engine.communicator()->world_size() : 1,
          engine.config().train_micro_batch_size_per_gpu, engine.config().gradient_accumulation_steps};
}

nlohmann::json checkpoint_state(const SupervisedLoopSettings& settings, GuardedRun* guard,
                                const engine::TrainingEngine& engine, int64_t epoch, int64_t batch) {
  nlohmann::json state = settings.client_state ? settings.client_state() : nlohmann::json::object();
  DSCHAT_CHECK(state.is_object() && !state.contains("epoch") && !state.contains("batch") &&
                   !state.contains("guardian") && !state.contains(data_layout_key()),
               InvalidArgument, "SupervisedLoop: client_state must be a JSON object without the loop's keys 'epoch', "
               "'batch', 'guardian' and '", data_layout_key(), "', got ", state.dump());
  state["epoch"] = epoch;
  state["batch"] = batch;  // micro-batches of this rank, in the layout saved beside it
  state[data_layout_key()] = layout_of(engine).to_json();
  if (guard) state["guardian"] = guard->guardian().state();
  return state;
}

// `where` names the step ("step 1 (SFT)") in the activity a stalled rank is reported by.
void evaluate(const SupervisedLoopSettings& settings, const std::string& where, EvaluationPoint point, int64_t epoch,
              int64_t step) {
  core::HostSync sync("evaluation (perplexity / reward accuracy)");
  dist::set_activity(where + ": evaluation at global step " + std::to_string(step));
  if (settings.evaluate) settings.evaluate(EvaluationRequest{point, epoch, step});
}

// The micro-batch losses of one epoch, left on the device until a read point; then one copy
// brings them to the host, where they are summed in micro-batch order exactly as an immediate
// `loss.item<double>()` each would have been, and the reports of the steps ended since run.
class EpochLosses {
 public:
  EpochLosses(int64_t gas, monitor::Progress& progress, GuardedRun* guard, bool uses_loss_scaling)
      : gas_(static_cast<double>(gas)), progress_(progress), guard_(guard), uses_loss_scaling_(uses_loss_scaling) {}

  void add(const torch::Tensor& loss) {
    unread_.push_back(loss.detach());  // []
    ++trained_;
  }

  // The step `done` ends the window of the losses added so far; `report` runs at the next read.
  // `bad_weights` ([] on the losses' device, or undefined: not checked) is the engine's
  // non_finite_weight_count after the step, read with the losses.
  void end_window(const OptimizerStepDone& done, StepReport report, nlohmann::json window, torch::Tensor bad_weights) {
    pending_.push_back(
        PendingStep{done, unread_.size(), std::move(report), std::move(window), std::move(bad_weights), 0.0});
  }

  // The one host read: every unread loss, then the pending reports in step order, each step
  // checked by the guardian. Throws GuardianAlarm (on every rank alike) for a stop or rollback.
  void read() {
    if (unread_.empty() && pending_.empty()) return;
    std::vector<torch::Tensor> scalars = unread_;  // the losses, then the weight checks
    for (const PendingStep& step : pending_) {
      if (step.bad_weights.defined()) scalars.push_back(step.bad_weights);
    }
    std::vector<double> values = read_to_host(scalars);
    for (auto step = pending_.rbegin(); step != pending_.rend(); ++step) {
      if (!step->bad_weights.defined()) continue;
      step->bad_weight_count = values.back();
      values.pop_back();
    }
    size_t next = 0;
    std::vector<double> window_losses;  // one per pending step, this rank's
    for (PendingStep& step : pending_) {
      for (; next < step.losses_before; ++next) accumulate(values[next]);
      step.done.window_loss = window_loss_;
      window_losses.push_back(window_loss_);
      window_loss_ = 0.0;
    }
    for (; next < values.size(); ++next) accumulate(values[next]);
    if (guard_) window_losses = guard_->mean_over_ranks(window_losses);
    std::optional<GuardianAlarm> alarm;
    for (size_t i = 0; i < pending_.size(); ++i) {
      const PendingStep& step = pending_[i];
      const std::string extra = step.report ? step.report(step.done) : std::string();
      progress_.update(step.done.step, extra);
      if (!guard_ || alarm) continue;
      monitor::StepFigures figures;
      figures.step = step.done.step;
      figures.loss = window_losses[i];
      if (!uses_loss_scaling_) figures.grad_norm = step.done.grad_norm;
      if (step.bad_weights.defined()) figures.non_finite_weights = step.bad_weight_count;
      const monitor::GuardianVerdict verdict = guard_->guardian().observe(figures);
      if (verdict.action >= monitor::GuardianAction::kStop) {
        alarm = GuardianAlarm{verdict.action, step.done.step, verdict.cause(), step.window};
      }
    }
    const int64_t last_step = pending_.empty() ? 0 : pending_.back().done.step;
    unread_.clear();
    pending_.clear();
    if (!guard_) return;
    const monitor::GuardianAction agreed = guard_->agree(alarm ? alarm->action : monitor::GuardianAction::kOff);
    if (agreed < monitor::GuardianAction::kStop) return;
    if (!alarm) alarm = GuardianAlarm{agreed, last_step, "another rank's verdict", nullptr};
    alarm->action = agreed;
    throw *alarm;
  }

  int64_t trained() const { return trained_; }
  // Only after read(): the losses read so far that were finite.
  int64_t finite() const { return finite_; }
  // Only after read().
  double mean_loss() const { return trained_ > 0 ? loss_sum_ / static_cast<double>(trained_) : 0.0; }

 private:
  struct PendingStep {
    OptimizerStepDone done;
    size_t losses_before = 0;  // unread losses up to this step's window end
    StepReport report;
    nlohmann::json window;
    torch::Tensor bad_weights;  // [] or undefined
    double bad_weight_count;    // its value, once read
  };

  void accumulate(double value) {
    if (std::isfinite(value)) ++finite_;
    loss_sum_ += value;
    window_loss_ += value / gas_;
  }

  double gas_;
  monitor::Progress& progress_;
  GuardedRun* guard_;
  bool uses_loss_scaling_;  // fp16: a skipped step is an overflow, not a fault
  std::vector<torch::Tensor> unread_;  // each [], on the loss's device
  std::vector<PendingStep> pending_;
  int64_t trained_ = 0;
  int64_t finite_ = 0;
  double loss_sum_ = 0.0, window_loss_ = 0.0;
};

// The loop's hold on the data and the engine, shared by the epoch and the guardian's actions.
struct LoopState {
  const SupervisedLoopSettings& settings;
  StepRunner& runner;
  engine::TrainingEngine& engine;
  GuardedRun* guard;  // null: no guardian
  SampleLog* samples;  // null: log_sample_ids is off
  int64_t trained = 0, finite = 0;  // micro-batches trained in this run (completed epochs), with a finite loss

  void save(engine::AsyncCheckpointWriter* background, int64_t epoch, int64_t batch) {
    dist::set_activity(runner.name() + ": checkpoint of global step " + std::to_string(engine.global_steps()));
    engine.save_checkpoint(runner.checkpoint_dir(), "", checkpoint_state(settings, guard, engine, epoch, batch),
                           background);
  }
  void snapshot(int64_t epoch, int64_t batch) {
    guard->take_snapshot(engine.global_steps(), [&](const std::filesystem::path& dir, const std::string& tag) {
      engine.save_checkpoint(dir, tag, checkpoint_state(settings, guard, engine, epoch, batch), nullptr);
    });
  }
};

// One epoch from micro-batch `skip` on (the ones before were consumed before a resume).
void run_epoch(LoopState& loop, monitor::Progress& progress, SupervisedEpoch& data, int64_t epoch, int64_t skip) {
  const SupervisedLoopSettings& settings = loop.settings;
  engine::TrainingEngine& engine = loop.engine;
  const int64_t read_interval = std::max<int64_t>(settings.progress_interval, 1);
  DSCHAT_CHECK(!loop.samples || data.sample_ids, InvalidArgument,
               "SupervisedLoop: log_sample_ids is on but the epoch source gives no sample_ids");
  EpochLosses losses(engine.config().gradient_accumulation_steps, progress, loop.guard, engine.uses_loss_scaling());
  int64_t batch_index = 0, window_begin = skip;
  auto window_start = core::SteadyClock::now();
  while (data.next()) {
    // Fetched anyway: the skipped batches are collated so the epoch's order is the one they had.
    if (batch_index++ < skip) continue;
    if (loop.guard && skipped_prompt_batch(loop.guard->guardian(), epoch, batch_index - 1)) continue;
    const std::string position = loop.runner.name() + ": epoch " + std::to_string(epoch + 1) + ", micro-batch " +
                                 std::to_string(batch_index - 1);
    dist::set_activity(position + ": forward and backward");
    torch::Tensor loss = data.loss();  // []
    engine.backward(loss);
    // The step this gradient goes into: the one after those taken so far.
    if (loop.samples) loop.samples->record(epoch, batch_index - 1, engine.global_steps() + 1, data.sample_ids());
    losses.add(loss);
    if (settings.after_backward) {  // DS-Chat's per-micro-step loss line: a read per micro-step, on request
      core::HostSync sync("statistics (print_loss: every micro-step, on request)");
      settings.after_backward(MicroBatchDone{epoch, batch_index - 1, loss.item<double>()});
    }
    // Asked before step(), which advances the micro-step count the answer depends on.
    const bool boundary = engine.is_gradient_accumulation_boundary();
    if (boundary) dist::set_activity(position + ": optimizer step " + std::to_string(engine.global_steps() + 1));
    engine.step();
    if (!boundary) continue;
    OptimizerStepDone done{epoch, batch_index, engine.global_steps(), core::seconds_since(window_start), 0.0,
                           engine.learning_rates(), engine.last_grad_norm()};
    torch::Tensor bad_weights;  // []
    if (loop.guard && loop.guard->guardian().config().non_finite.action != monitor::GuardianAction::kOff) {
      bad_weights = engine.non_finite_weight_count().to(loss.device(), /*non_blocking=*/true);
    }
    losses.end_window(done, data.step_report ? data.step_report() : StepReport(),
                      {{"epoch", epoch}, {"begin", std::min(window_begin, batch_index - 1)}, {"end", batch_index}},
                      std::move(bad_weights));
    window_begin = batch_index;
    const bool evaluate_now = settings.eval_interval > 0 && done.step % settings.eval_interval == 0;
    const bool snapshot_now = loop.guard && loop.guard->snapshot_due(done.step);
    // The guardian checks every step before a checkpoint or a snapshot holds it.
    if (evaluate_now || snapshot_now || done.step % read_interval == 0 || loop.runner.checkpoint_due(done.step)) {
      losses.read();
    }
    if (snapshot_now) loop.snapshot(epoch, batch_index);
    if (evaluate_now) evaluate(settings, loop.runner.name(), EvaluationPoint::kInterval, epoch, done.step);
    loop.runner.after_optimizer_step(done.step, [&](engine::AsyncCheckpointWriter* background) {
      losses.read();  // the reports of the steps before a checkpoint (and a Ctrl-C) are never lost
      loop.save(background, epoch, batch_index);
    });
    window_start = core::SteadyClock::now();
  }
  losses.read();
  loop.trained += losses.trained();
  loop.finite += losses.finite();
  if (settings.on_epoch_end) settings.on_epoch_end(EpochDone{epoch, losses.trained(), losses.mean_loss()});
}

// The guardian off, every loss NaN (e.g. no label token left in any row) can still leave finite
// gradients and updates that only decay the weights: the output gate would pass that model.
// Collective: every rank fails alike.
void refuse_all_non_finite_losses(const LoopState& loop) {
  int64_t counts[2] = {loop.trained, loop.finite};
  if (loop.engine.communicator()) {
    torch::Tensor t = torch::tensor({counts[0], counts[1]}, torch::kInt64);  // [2]
    loop.engine.communicator()->all_reduce(t, dist::ReduceOp::Sum);
    counts[0] = t[0].item<int64_t>();
    counts[1] = t[1].item<int64_t>();
  }
  if (counts[0] == 0 || counts[1] > 0) return;
  const std::string checkpoints = loop.runner.checkpoint_dir().string();
  const std::string output_dir = checkpoints.substr(0, checkpoints.size() - std::string("_checkpoints").size());
  throw StepFailed(output_dir + ": the model is not saved and the step is not marked finished: the loss of every one of the " +
                   std::to_string(counts[0]) + " micro-batches trained in this run was NaN or Inf (no label token left "
                   "after truncation to max_seq_len? the guardian, off here, stops such runs); " +
                   checkpoint_note(output_dir));
}

}  // namespace

std::vector<double> read_to_host(const std::vector<torch::Tensor>& scalars) {
  if (scalars.empty()) return {};
  std::vector<torch::Tensor> rows;  // each [1]
  rows.reserve(scalars.size());
  for (const torch::Tensor& t : scalars) {
    DSCHAT_CHECK(t.defined() && t.numel() == 1, InvalidArgument, "read_to_host: expected scalar tensors, got ",
                 t.defined() ? core::shape_of(t) : "undefined");
    rows.push_back(t.detach().reshape({1}).to(torch::kFloat64));  // exact for every float and int below 2^53
  }
  core::HostSync sync("statistics (every print_interval)");
  torch::Tensor host = torch::cat(rows).to(torch::kCPU).contiguous();  // [n]: the copy is the one wait
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

void log_step_throughput(const OptimizerStepDone& done, int64_t rows, int64_t sequence, const core::ModelConfig& model,
                         const ModelTrainingConfig& training, const CommonStepConfig& common,
                         const StepContext& context) {
  if (context_rank(context) != 0 || common.print_interval <= 0 || done.step % common.print_interval != 0) return;
  core::log_info(monitor::training_throughput_line(model, rows, sequence, done.seconds, training.gradient_checkpointing,
                                                   training.lora_dim, context_world(context)));
}

void SupervisedLoopSettings::use_step_config(const CommonStepConfig& common, const StepContext& context) {
  epochs = common.num_train_epochs;
  allow_global_batch_change = common.elastic_resume_allowed;
  log_sample_ids = common.log_sample_ids;
  guardian = common.guardian;
  seed = common.seed;
  progress_interval = common.print_interval;
  plain_progress = !context.progress;
}

namespace {

// Where the epochs start: a resume's position, with the trainer's state, the guardian's and the
// sample log's restored, or (fresh) epoch 0 after the evaluation before training.
struct LoopStart {
  int64_t epoch = 0, micro_batch = 0;
};
LoopStart resume_or_start(const SupervisedLoopSettings& settings, StepRunner& runner, engine::TrainingEngine& engine,
                          GuardedRun* guard, SampleLog* samples) {
  if (!runner.prepare_resume()) {
    if (samples) samples->rewind(0, {{"event", "start"}, {"layout", layout_of(engine).to_json()}});
    evaluate(settings, runner.name(), EvaluationPoint::kBeforeTraining, 0, engine.global_steps());
    return {};
  }
  ResumePoint at;
  core::HostSync sync("step setup (models, engines, data)");
  at.client_state = engine.load_checkpoint(runner.checkpoint_dir());
  at.epoch = at.client_state.at("epoch").get<int64_t>();
  // Counted in this run's layout: another world size or micro-batch continues at the same sample.
  at.micro_batch =
      resume_micro_batch(at.client_state, layout_of(engine), settings.allow_global_batch_change, runner.name());
  if (guard && at.client_state.contains("guardian")) {
    guard->guardian().load_state(guardian_state_for(at.client_state, layout_of(engine)));
  }
  at.client_state.erase("guardian");
  if (settings.on_resume) settings.on_resume(at);
  if (samples) {
    samples->rewind(engine.global_steps(), {{"event", "resume"}, {"epoch", at.epoch}, {"micro_batch", at.micro_batch},
                                            {"layout", layout_of(engine).to_json()}});
  }
  return {at.epoch, at.micro_batch};
}

}  // namespace

void run_supervised_loop(const SupervisedLoopSettings& settings, StepRunner& runner, engine::TrainingEngine& engine,
                         const std::function<SupervisedEpoch(int64_t epoch)>& begin_epoch) {
  DSCHAT_CHECK(settings.save_model && begin_epoch, InvalidArgument,
               "SupervisedLoop: save_model and the epoch source are required");
  DSCHAT_CHECK(settings.epochs >= 0, InvalidArgument, "SupervisedLoop: epochs is ", settings.epochs);
  std::optional<GuardedRun> guard;
  if (settings.guardian.enabled) {
    guard.emplace(settings.guardian, runner.name(), runner, settings.metrics, engine.communicator());
  }
  std::optional<SampleLog> samples;
  if (settings.log_sample_ids) samples.emplace(runner.log_dir(), engine.communicator());
  LoopState loop{settings, runner, engine, guard ? &*guard : nullptr, samples ? &*samples : nullptr};
  const LoopStart start = resume_or_start(settings, runner, engine, loop.guard, loop.samples);
  int64_t start_epoch = start.epoch, skip = start.micro_batch;
  // The state a first rollback returns to: the start (or the resumed position).
  if (guard && guard->snapshot_due(engine.global_steps())) loop.snapshot(start_epoch, skip);

  monitor::Progress progress(settings.progress_label, settings.progress_total, settings.progress_interval,
                             settings.plain_progress);
  for (bool done = false; !done;) {
    try {
      for (int64_t epoch = start_epoch; epoch < settings.epochs; ++epoch) {
        SupervisedEpoch data = begin_epoch(epoch);
        core::log_info("Beginning of Epoch ", epoch + 1, "/", settings.epochs, ", Total Micro Batches ",
                       data.micro_batches);
        run_epoch(loop, progress, data, epoch, skip);
        skip = 0;
        evaluate(settings, runner.name(), EvaluationPoint::kEpochEnd, epoch, engine.global_steps());
        // Only where no accumulation window is open: a window running on into the next epoch has
        // gradients a checkpoint does not hold; the resume then starts from the last periodic one.
        if (engine.micro_steps() % engine.config().gradient_accumulation_steps == 0) {
          runner.save_checkpoint([&](engine::AsyncCheckpointWriter* background) { loop.save(background, epoch + 1, 0); });
        }
      }
      done = true;
    } catch (const GuardianAlarm& alarm) {
      // A checkpoint of where the run stands when it stops, unless an accumulation window is open.
      StepRunner::SaveFunction save_here;
      if (engine.micro_steps() % engine.config().gradient_accumulation_steps == 0) {
        save_here = [&](engine::AsyncCheckpointWriter* background) {
          loop.save(background, alarm.skipped.is_object() ? alarm.skipped.value("epoch", int64_t{0}) : start_epoch,
                    alarm.skipped.is_object() ? alarm.skipped.value("end", int64_t{0}) : 0);
        };
      }
      answer_guardian_alarm(
          alarm, *guard, runner,
          [&](const std::filesystem::path& dir, const std::string& tag) {
            const nlohmann::json state = engine.load_checkpoint(dir, tag);
            start_epoch = state.at("epoch").get<int64_t>();
            skip = state.at("batch").get<int64_t>();
            if (samples) samples->rewind(engine.global_steps(), {{"event", "rollback"}, {"epoch", start_epoch}});
          },
          {&engine}, save_here, settings.seed);
    }
  }
  progress.finish();
  if (start_epoch >= settings.epochs) {  // resumed from the last epoch's end checkpoint
    evaluate(settings, runner.name(), EvaluationPoint::kResumedAtEnd, settings.epochs, engine.global_steps());
  }
  core::HostSync sync("step end (evaluation, save)");
  // The end-of-training checkpoint is committed before the model is written: a failure there
  // resumes from it rather than from the one before.
  refuse_all_non_finite_losses(loop);
  dist::set_activity(runner.name() + ": saving the trained model");
  runner.wait_for_checkpoints();
  settings.save_model();
  if (guard) guard->finish();
  runner.finish();
}

}  // namespace rlhf
}  // namespace dschat
