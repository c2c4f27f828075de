#pragma once
// The skeleton every policy-optimisation step runs in (PPO, GRPO/RLOO/REINFORCE++, a user's own
// algorithm), the counterpart of the supervised steps' SupervisedLoop. The loop owns:
//   - the prompts: each rank's share of phase 3's split, one epoch after another, in prompt
//     batches of generation_batch_size, skipping what a resume or a guardian rollback says;
//   - the step's checkpoints: resume (newest intact tag), a checkpoint every checkpoint_interval
//     steps with retention, the final wait; the policy's checkpoint (part "actor") carries the
//     position, the step count, the guardian's state and the algorithm's state();
//   - the guardian: snapshots, the held-out check, its verdicts and rollbacks (the collected data
//     dropped, the models and position restored, the learning rates lowered, the batches skipped);
//   - the sample-id log, the process activity a stalled collective reports, the progress display.
// The algorithm (PolicyAlgorithm) owns its models and says what a step is:
//
//   for each epoch, for each prompt batch of this rank:
//     collect(batch)            -> kSkipped | kCollected | kStepReady
//     when kStepReady: train(step) -> the step's figures for the guardian (or nullopt: the
//                                     algorithm's own reports check them, e.g. PPO's deferred read)
//     snapshot / checkpoint at an accumulation boundary
//   save_outputs(steps)
//
// Collective: every rank runs the same loop over its share of the prompts. Errors as run_ppo.
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dschat/data/collate.h"
#include "dschat/data/sampler.h"
#include "dschat/data/prompt_dataset.h"
#include "dschat/engine/async_checkpoint_writer.h"
#include "dschat/engine/training_engine.h"
#include "dschat/monitor/guardian.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/monitor/progress.h"
#include "dschat/rlhf/loop/guarded_run.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"
#include "dschat/rlhf/setup/step_runner.h"

namespace dschat {
namespace rlhf {

class PolicyLoop;
class SampleLog;

/// The prompt batch a collect() call receives.
struct PolicyBatch {
  int64_t epoch = 0;        // 0-based
  int64_t index = 0;        // the batch's index in this rank's epoch
  int64_t step = 0;         // the step (1-based) the batch's data feeds
  uint64_t sample_seed = 0; // the seed for sampling its answers: differs per rank, batch and rollback
};

/// The step a train() call makes.
struct PolicyStep {
  int64_t epoch = 0;
  int64_t step = 0;           // 1-based: the optimizer step this call takes
  int64_t first_batch = 0;    // the step's prompt batches: [first_batch, end_batch) of `epoch`
  int64_t end_batch = 0;      // (first_batch may be in the epoch before, when steps span epochs)
  int64_t progress_done = 0;  // prompt batches of the run done (the progress display's count)
};

/// What collect() did with a prompt batch.
enum class Collected {
  kSkipped,    // nothing kept (e.g. every answer too short): the batch is not part of a step
  kCollected,  // kept; the step needs more batches
  kStepReady,  // kept; the step's data is complete: train() follows
};

/// An algorithm the PolicyLoop runs. The loop calls, in this order: device(), engines() and
/// other_parts() once; restore() on a resume; heldout_score() for the guardian's held-out check;
/// start(); then per epoch collect()/train(), read_reports() before a snapshot, checkpoint or
/// printed step and at the end; drop_collected() when a rollback or an epoch's end abandons what
/// was collected; save_outputs() last.
class PolicyAlgorithm {
 public:
  virtual ~PolicyAlgorithm() = default;

  /// Where the prompt batches go (the policy's device).
  virtual torch::Device device() const = 0;
  /// The engines a step updates, the policy's first: its checkpoint (part "actor") holds the
  /// loop's state and decides the tags; a rollback lowers every one's learning rate.
  virtual std::vector<engine::TrainingEngine*> engines() = 0;
  /// The checkpoint parts besides "actor" (e.g. {"critic", "ema"}), written by save_parts.
  virtual std::vector<std::string> other_parts() const { return {}; }
  /// Writes the other parts' state of checkpoint `tag` under `dir` (dir / part); before the
  /// policy's, which is written last and commits the tag. `background`: the runner's writer, or
  /// null to write before returning.
  virtual void save_parts(const std::filesystem::path& /*dir*/, const std::string& /*tag*/,
                          engine::AsyncCheckpointWriter* /*background*/) {}
  /// Reads them back (after the policy's engine loaded `tag`).
  virtual void load_parts(const std::filesystem::path& /*dir*/, const std::string& /*tag*/) {}
  /// The algorithm's history kept in each checkpoint (keys besides the loop's), and its restore
  /// on a resume or rollback (`state` is the whole checkpoint state, "step" included).
  virtual nlohmann::json state() const { return nlohmann::json::object(); }
  virtual void restore(const nlohmann::json& /*state*/) {}

  /// The guardian's held-out check: a score of greedy answers to the fixed `prompts` (higher is
  /// better). Called with the random state saved and restored around it.
  virtual double heldout_score(const data::PromptBatch& prompts) = 0;

  /// Once, after the resume and the guardian's first snapshot: the loop's metrics, progress and
  /// guard are ready.
  virtual void start(PolicyLoop& /*loop*/) {}
  /// Called for every prompt batch index of an epoch, skipped ones included, before the batch is
  /// used: the algorithm draws its companion data (PPO's unsupervised mixture). False ends the epoch.
  virtual bool draw_companion(int64_t /*epoch*/, int64_t /*batch_index*/) { return true; }
  /// Makes experience of one prompt batch (on device()).
  virtual Collected collect(const data::PromptBatch& batch, const PolicyBatch& at) = 0;
  /// Trains on what was collected: one optimizer step of every engine. Returns the step's figures
  /// for the guardian (checked with the step's batches as the rollback's skip range), or nullopt
  /// when the algorithm checks them itself (through PolicyLoop::check_step).
  virtual std::optional<monitor::StepFigures> train(const PolicyStep& step) = 0;
  /// Reads any step statistics the algorithm defers (a stop or rollback found there throws as
  /// PolicyLoop::check_step does).
  virtual void read_reports() {}
  /// Forgets the collected data not yet trained on (after a rollback; at an epoch's end when
  /// steps do not span epochs).
  virtual void drop_collected() = 0;
  /// Saves the trained models and the step's summary, after the last checkpoint is committed.
  virtual void save_outputs(int64_t steps) = 0;
};

struct PolicyLoopSettings {
  std::string where;           // "step 3 (PPO)": in messages
  std::string progress_name;   // the progress display's label
  std::filesystem::path output_dir;
  CommonStepConfig common;
  int64_t generation_batch_size = 1;  // prompts per rank per batch
  /// Prompt batches a step collects at least: with the world size and batch size, the data
  /// layout a checkpoint's position counts in (an elastic resume converts it).
  int64_t generation_batches = 1;
  int64_t prompt_length = 0;   // prompts are left-padded (or cut) to this many tokens
  /// Whether collected data carries over into the next epoch (PPO's generation_batches) or is
  /// dropped, with a warning, at an epoch's end (the critic-free step's dynamic sampling pool).
  bool steps_span_epochs = false;
  /// Stop after the first accumulation boundary at or after this step (0: run every epoch).
  int64_t stop_after_step = 0;
};

class PolicyLoop {
 public:
  /// Checks the output directory (StepRunner); nothing is loaded yet.
  PolicyLoop(PolicyLoopSettings settings, const StepContext& context);
  ~PolicyLoop();
  PolicyLoop(const PolicyLoop&) = delete;
  PolicyLoop& operator=(const PolicyLoop&) = delete;

  /// The prompts (phase 3's split, kept by reference until run() returns), padded with
  /// `pad_token_id`: sets steps_per_epoch, this rank's prompt batches per epoch, capped at
  /// `max_batches_per_epoch` when >= 0.
  void set_prompts(const data::PhaseData& phase, int64_t pad_token_id, int64_t max_batches_per_epoch = -1);
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t rank() const { return rank_; }
  int64_t world() const { return world_; }
  const PolicyLoopSettings& settings() const { return settings_; }
  const StepContext& context() const { return context_; }
  StepRunner& runner() { return runner_; }

  /// Runs every epoch with `algorithm` (see the class comment), then saves its outputs and removes
  /// the checkpoints and snapshots. Collective.
  void run(PolicyAlgorithm& algorithm);

  // Ready from PolicyAlgorithm::start() on.
  monitor::MetricsLog& metrics() { return *metrics_; }
  monitor::Progress& progress() { return *progress_; }
  GuardedRun& guard() { return *guard_; }
  /// The held-out check (empty when the guardian has none), for algorithms that check their steps
  /// themselves; it keeps the random state.
  const std::function<double()>& heldout_check() const { return heldout_check_; }
  /// Collective: the guardian's verdict on a step's `figures` (and, when due, the held-out check);
  /// a stop or rollback throws, the loop answers it. `first_batch`/`end_batch`/`epoch`: the step's
  /// prompt batches, skipped after a rollback.
  void check_step(const monitor::StepFigures& figures, int64_t epoch, int64_t first_batch, int64_t end_batch);
  /// Steps trained so far (restored on a resume).
  int64_t step() const { return step_; }
  bool resumed() const { return resumed_; }

 private:
  struct Position {
    int64_t epoch = 0, next_batch = 0;
  };
  void open(PolicyAlgorithm& algorithm);
  nlohmann::json restore(PolicyAlgorithm& algorithm, const std::filesystem::path& dir, const std::string& tag);
  void save_state(PolicyAlgorithm& algorithm, const std::filesystem::path& dir, const std::string& tag,
                  Position position, engine::AsyncCheckpointWriter* background);
  void snapshot(PolicyAlgorithm& algorithm, Position position, bool confirmed);
  void run_epochs(PolicyAlgorithm& algorithm);
  void run_epoch(PolicyAlgorithm& algorithm, int64_t epoch);
  // After a kStepReady batch: the step, the guardian's check, the snapshot and the checkpoint.
  void train_step(PolicyAlgorithm& algorithm, int64_t epoch, int64_t batch_index);
  bool at_accumulation_boundary(PolicyAlgorithm& algorithm);

  PolicyLoopSettings settings_;
  const StepContext& context_;
  int64_t rank_ = 0, world_ = 1;
  StepRunner runner_;
  const data::PhaseData* phase_ = nullptr;
  int64_t pad_token_id_ = 0;
  std::optional<data::DistributedSampler> sampler_;
  int64_t steps_per_epoch_ = 0;
  torch::Device device_{torch::kCPU};

  std::unique_ptr<monitor::MetricsLog> metrics_;
  std::unique_ptr<GuardedRun> guard_;
  std::unique_ptr<monitor::Progress> progress_;
  std::unique_ptr<SampleLog> samples_;  // null: log_sample_ids is off
  std::optional<data::PromptBatch> heldout_;
  std::function<double()> heldout_check_;

  int64_t step_ = 0;
  bool resumed_ = false;
  Position start_;             // where the epochs (re)start: a resume's or a rollback's position
  int64_t collected_ = 0;      // batches collected for the step being gathered
  int64_t first_batch_ = 0;    // its first
  bool stopping_ = false;      // stop_after_step reached; stop at the next boundary
};

}  // namespace rlhf
}  // namespace dschat
