#pragma once
// Step 3's per-step reports (src/rlhf/trainers/ppo_trainer.cpp): the log lines, metrics rows, collapse
// warnings, progress display and reward history of each PPO step, written when its statistics are
// read (every print_interval steps, before a snapshot or checkpoint, at the end), each step then
// checked by the guardian.
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dschat/monitor/collapse_warnings.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/loop/policy_loop.h"
#include "dschat/rlhf/loop/ppo_step.h"
#include "dschat/rlhf/trainers/ppo_trainer.h"
#include "dschat/rlhf/config/step_context.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace rlhf {

// The answers of sequences [B, L] after their prompt columns as text, special tokens skipped
// (the repeated-answer check): one copy of the answer block to the host.
std::vector<std::string> decode_answers(const torch::Tensor& seq, int64_t prompt_length,
                                        const tokenizer::Tokenizer& tokenizer);

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
  torch::Tensor non_finite_weights;        // [] actor + critic after the step (undefined: not checked)
};

// The step reports of step 3 (log lines, metrics rows, collapse warnings, the progress display,
// the result's reward history), written when the statistics are read: every print_interval
// steps, before a checkpoint and at the end. Each step's lines and rows are those an immediate
// read would have written; all-reduced as before, so every rank must read at the same steps.
class PpoStepReports {
 public:
  /// `loop`: its metrics, progress display and guardian check (PolicyLoop::check_step).
  PpoStepReports(const PpoConfig& config, const StepContext& context, const tokenizer::Tokenizer& tokenizer,
                 PolicyLoop& loop, PpoResult& result, bool have_reward_ema)
      : config_(config), context_(context), tokenizer_(tokenizer), loop_(loop), result_(result),
        have_reward_ema_(have_reward_ema), collapse_(config.max_answer_seq_len, config.min_answer_tokens) {}

  PpoStatsQueue& stats() { return stats_; }
  // After a rollback: the unread statistics belong to the abandoned steps.
  void restart(bool have_reward_ema);
  monitor::CollapseWatch& collapse() { return collapse_; }
  void step_ended(PendingPpoStep step) { pending_.push_back(std::move(step)); }

  // The one read of the queued statistics, then each pending step's report in order, each
  // checked by the guardian (a stop or rollback throws GuardianAlarm, the later steps unreported).
  void read();

 private:
  void report(const PendingPpoStep& p, const PpoStepMeans& m);

  const PpoConfig& config_;
  const StepContext& context_;
  const tokenizer::Tokenizer& tokenizer_;
  PolicyLoop& loop_;
  PpoResult& result_;
  bool have_reward_ema_;
  monitor::CollapseWatch collapse_;
  PpoStatsQueue stats_;
  std::vector<PendingPpoStep> pending_;
};

}  // namespace rlhf
}  // namespace dschat
