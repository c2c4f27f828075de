#pragma once
// The resumable epoch loop of a supervised trainer: step 1 (SFT), step 2 (reward model), and a
// user's own supervised or pairwise trainer (DPO, ...). The trainer supplies its batches, its
// forward + loss and its reports; the loop owns what must be identical everywhere for an
// interrupted run to resume bit for bit:
//   * resume: the engine checkpoint's client state {"epoch", "batch", "data_layout", ...the
//     trainer's keys}, the micro-batches of that epoch already consumed are fetched and skipped;
//     on another world size or micro-batch size the position is converted, so the run goes on
//     at the first unseen sample of the epoch's order (src/rlhf/setup/data_layout.h);
//   * per micro-batch: engine.backward(loss), engine.step(); at the end of each accumulation
//     window: an evaluation every eval_interval steps, runner.after_optimizer_step with a
//     checkpoint of the position (Ctrl-C, checkpoint_interval);
//   * the losses stay on the model's device: they are read to the host once every
//     progress_interval optimizer steps (one copy of all of them), before an evaluation, a
//     checkpoint and the end of each epoch; the reports of the steps ended since (the trainer's
//     on_optimizer_step, the progress line) then run in order, with the values an immediate read
//     would have given (the same host arithmetic), so on a GPU no micro-step waits for the device;
//   * evaluations before training (not when resuming), after every epoch, and once more when a
//     run resumes after its last epoch; a checkpoint at every epoch end that leaves no
//     accumulation window open (a window may run on into the next epoch);
//   * the guardian (monitor/guardian.h, docs/guardian.md), when `guardian.enabled`: at every read
//     point each step's loss (all ranks' mean) and gradient norm are checked; a healthy step that
//     is a multiple of snapshot_interval is snapshotted (rlhf/loop/guarded_run.h; a read is forced
//     there); a rollback restores the snapshot, skips (or retries) the offending step's
//     micro-batches, lowers the learning rate, reseeds and goes on; a stop saves a checkpoint and
//     throws monitor::GuardianStop. Its state travels in the checkpoints' "guardian" key;
//   * the end: save_model (the trainer's final save), then runner.finish() drops the checkpoints.
//
//   rlhf::SupervisedLoop<data::SftBatch> loop;
//   loop.epochs = 2;
//   loop.epoch_batches = [&](int64_t epoch) { return data::EpochBatches<data::SftBatch>(sampler, epoch, ...); };
//   loop.train_micro_batch = [&](const data::SftBatch& host) {  // collated on the CPU
//     data::SftBatch b = host.to(device, /*non_blocking=*/true);
//     return causal_lm_loss(model->forward(b.input_ids, b.attention_mask), b.labels);
//   };
//   loop.save_model = [&] { save_trained_model(engine, ...); };
//   loop.run(runner, engine);
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/core/error.h"
#include "dschat/core/model_config.h"
#include "dschat/data/epoch_batches.h"
#include "dschat/engine/training_engine.h"
#include "dschat/monitor/guardian.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"
#include "dschat/rlhf/setup/step_runner.h"

namespace dschat {
namespace rlhf {

/// Where a resumed run continues (passed to on_resume before anything else happens).
struct ResumePoint {
  int64_t epoch = 0;        // the epoch to continue; == epochs when every epoch had ended
  int64_t micro_batch = 0;  // micro-batches of that epoch already consumed (skipped now)
  nlohmann::json client_state;  // the checkpoint's whole client state, "epoch" and "batch" included
};

/// One micro-batch after its backward (before engine.step()).
struct MicroBatchDone {
  int64_t epoch = 0;
  int64_t index = 0;  // 0-based micro-batch index within the epoch, skipped ones counted
  double loss = 0.0;  // the micro-batch's loss as train_micro_batch returned it (this rank)
};

/// An optimizer step that ended an accumulation window, as its report sees it (at the loop's
/// next read point, so everything of the step's moment is recorded here).
struct OptimizerStepDone {
  int64_t epoch = 0;
  int64_t micro_batch = 0;   // micro-batches of the epoch consumed so far: the checkpoint's "batch"
  int64_t step = 0;          // engine.global_steps() after the step
  double seconds = 0.0;      // wall time since the previous window ended (or the epoch began)
  // This rank's sum of loss / GAS over the window's micro-batches of the current epoch (a window
  // running on into the next epoch counts only those); not all-reduced.
  double window_loss = 0.0;
  std::vector<double> learning_rates;  // engine.learning_rates() right after the step
  double grad_norm = 0.0;              // engine.last_grad_norm() (-1: non-finite, the step was skipped)
};

/// Reports one optimizer step (metrics rows, the throughput line) and returns the text after the
/// progress bar ("loss 0.42").
using StepReport = std::function<std::string(const OptimizerStepDone&)>;

/// An epoch whose micro-batches are all consumed (before its evaluation).
struct EpochDone {
  int64_t epoch = 0;
  int64_t micro_batches = 0;  // trained by this rank in this run (a resume's skipped ones excluded)
  double mean_loss = 0.0;     // their mean loss on this rank (0 when none); all-reduce it if needed
};

enum class EvaluationPoint {
  kBeforeTraining,  // a fresh run, before the first micro-batch (step 0)
  kInterval,        // after an optimizer step that is a multiple of eval_interval
  kEpochEnd,        // after each epoch, before its checkpoint
  kResumedAtEnd,    // a run resumed after its last epoch: nothing trains, the results are re-measured
};

struct EvaluationRequest {
  EvaluationPoint point = EvaluationPoint::kBeforeTraining;
  int64_t epoch = 0;  // the epoch running or just ended (0 before training, `epochs` at kResumedAtEnd)
  int64_t step = 0;   // engine.global_steps()
};

/// The untyped part of the loop: settings and the hooks that see no batch. Unset optional hooks
/// do nothing.
struct SupervisedLoopSettings {
  int64_t epochs = 1;
  /// kInterval evaluations every this many optimizer steps; 0: none.
  int64_t eval_interval = 0;
  /// The progress display (monitor::Progress): label, total optimizer steps of the whole run
  /// (optimizer_steps_for), a plain line every `progress_interval` steps, plain lines only.
  /// progress_interval is also how often the losses are read from the device.
  std::string progress_label = "training";
  int64_t progress_total = 0;
  int64_t progress_interval = 1;
  bool plain_progress = false;

  /// The training-health guardian (off unless set; use_step_config takes the step's, which is on
  /// by default) and where its events are written besides the console (null: nowhere).
  monitor::GuardianConfig guardian = disabled_guardian();
  monitor::MetricsLog* metrics = nullptr;
  /// The base of the seeds a rollback draws anew (guardian.reseed): the step's seed.
  uint64_t seed = 1234;

  /// epochs, progress_interval, plain_progress, guardian and seed from a step's config
  /// (num_train_epochs, print_interval, guardian, seed) and context (progress bars or plain lines).
  void use_step_config(const CommonStepConfig& common, const StepContext& context);
  /// A resume whose global batch (rows x GAS x ranks) differs from the checkpoint's goes on
  /// instead of being refused (the step's elastic_resume "allow"; src/rlhf/setup/data_layout.h).
  bool allow_global_batch_change = false;
  /// Writes the dataset indices of every trained micro-batch to <dir>_logs/samples.rank<r>.jsonl
  /// (the step's log_sample_ids; src/rlhf/setup/sample_log.h). The epoch source must set sample_ids.
  bool log_sample_ids = false;
  static monitor::GuardianConfig disabled_guardian() {
    monitor::GuardianConfig off;
    off.enabled = false;
    return off;
  }

  /// Evaluates and reports (log lines, metrics rows) at the request's point.
  std::function<void(const EvaluationRequest&)> evaluate;
  /// The trainer's keys for every checkpoint (an object without "epoch" and "batch", which the
  /// loop adds); called at each save.
  std::function<nlohmann::json()> client_state;
  /// Restores the trainer's state from a checkpoint (e.g. the "before" evaluation) and logs the
  /// resume.
  std::function<void(const ResumePoint&)> on_resume;
  /// Right after each backward, with the loss read to the host: set, it costs a wait for the
  /// device every micro-batch (SFT sets it only for print_loss); reports belong in the step hooks.
  std::function<void(const MicroBatchDone&)> after_backward;
  std::function<void(const EpochDone&)> on_epoch_end;
  /// Required: saves the trained model. Called once at the end, before the checkpoints are removed.
  std::function<void()> save_model;
};

/// One epoch's micro-batches as the untyped loop sees them; SupervisedLoop<Batch> builds it over
/// data::EpochBatches<Batch>. A trainer with its own batch source may build it directly.
struct SupervisedEpoch {
  int64_t micro_batches = 0;            // this rank's, for the log
  std::function<bool()> next;           // fetch one; false after the last
  std::function<torch::Tensor()> loss;  // forward + loss of the fetched one, []
  /// The report of the step whose window the fetched micro-batch ends, holding what it needs of
  /// that batch (it runs at a later read point); unset or an empty result: no report.
  std::function<StepReport()> step_report;
  /// The training-set indices of the fetched micro-batch's rows (needed for log_sample_ids).
  std::function<std::vector<int64_t>()> sample_ids;
};

/// DeepSpeed-Chat's per-step throughput line (monitor::training_throughput_line) on rank 0 every
/// common.print_interval optimizer steps: `rows` trained per optimizer step on one rank (SFT:
/// micro x GAS; a pairwise trainer counts chosen and rejected), `sequence` tokens per row.
void log_step_throughput(const OptimizerStepDone& done, int64_t rows, int64_t sequence, const core::ModelConfig& model,
                         const ModelTrainingConfig& training, const CommonStepConfig& common,
                         const StepContext& context);

/// The values of scalar tensors (each [] or [1], on one device, any dtype) as host doubles, with
/// one device-to-host copy: statistics a trainer kept on the device, read once. Each value is
/// what item<double>() would give (widened to float64 exactly).
std::vector<double> read_to_host(const std::vector<torch::Tensor>& scalars);

/// Runs the loop (see the file comment). Collective when the engine is: every rank runs it with
/// the same number of micro-batches. Throws core::InvalidArgument for missing required hooks,
/// a negative epoch count or a client state that is not an object or uses "epoch"/"batch"/"guardian";
/// monitor::GuardianStop when the guardian stops the run (after a checkpoint);
/// Interrupted from runner.after_optimizer_step when stopped; whatever the hooks throw.
void run_supervised_loop(const SupervisedLoopSettings& settings, StepRunner& runner, engine::TrainingEngine& engine,
                         const std::function<SupervisedEpoch(int64_t epoch)>& begin_epoch);

/// The loop over data::EpochBatches<Batch>: SFT uses data::SftBatch, the reward model
/// data::RewardBatch, a pairwise trainer its own batch type.
template <class Batch>
struct SupervisedLoop : SupervisedLoopSettings {
  /// Required: the micro-batches of one epoch (a distributed sampler's epoch, collated).
  std::function<data::EpochBatches<Batch>(int64_t epoch)> epoch_batches;
  /// Required: forward + loss of one micro-batch, a [] tensor; the loop calls engine.backward.
  std::function<torch::Tensor(const Batch&)> train_micro_batch;
  /// Each accumulation window's report, with the window's last micro-batch: metrics rows, the
  /// throughput line. Returns the text after the progress bar ("loss 0.42"). Runs at the read
  /// point after the step (see the file comment): take the step's figures from `done`, not the
  /// engine.
  std::function<std::string(const OptimizerStepDone&, const Batch&)> on_optimizer_step;

  void run(StepRunner& runner, engine::TrainingEngine& engine) const {
    DSCHAT_CHECK(epoch_batches && train_micro_batch, InvalidArgument,
                 "SupervisedLoop: epoch_batches and train_micro_batch are required");
    run_supervised_loop(*this, runner, engine, [this](int64_t epoch) {
      // Shared by the three closures; the fetched batch lives until the next fetch, as a
      // `while (auto batch = batches.next())` loop's would.
      struct State {
        data::EpochBatches<Batch> batches;
        std::optional<Batch> current;
        int64_t fetched = 0;  // micro-batches fetched so far; the current one is fetched - 1
      };
      auto state = std::make_shared<State>(State{epoch_batches(epoch), std::nullopt});
      SupervisedEpoch out;
      out.micro_batches = state->batches.size();
      out.next = [state] {
        state->current = state->batches.next();
        state->fetched += state->current.has_value() ? 1 : 0;
        return state->current.has_value();
      };
      out.sample_ids = [state] { return state->batches.indices(state->fetched - 1); };
      out.loss = [this, state] { return train_micro_batch(*state->current); };
      out.step_report = [this, state]() -> StepReport {
        if (!on_optimizer_step) return {};
        return [this, batch = *state->current](const OptimizerStepDone& done) { return on_optimizer_step(done, batch); };
      };
      return out;
    });
  }
};

}  // namespace rlhf
}  // namespace dschat
