#include "rlhf/trainers/ppo_reports.h"

#include <cmath>

#include "core/log.h"
#include "dschat/core/host_sync.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "rlhf/loop/policy_guard.h"

namespace dschat {
namespace rlhf {

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

void PpoStepReports::restart(bool have_reward_ema) {
  stats_.discard();
  pending_.clear();
  have_reward_ema_ = have_reward_ema;
}

void PpoStepReports::read() {
  if (pending_.empty()) return;
  core::HostSync sync("statistics (every print_interval)");
  const std::vector<PpoStepMeans> means = stats_.read();
  const std::vector<PendingPpoStep> pending = std::move(pending_);
  pending_.clear();
  DSCHAT_CHECK(means.size() == pending.size(), InvalidArgument, "PPO: ", means.size(), " steps of statistics for ",
               pending.size(), " steps");
  for (size_t i = 0; i < means.size(); ++i) report(pending[i], means[i]);
}

void PpoStepReports::report(const PendingPpoStep& p, const PpoStepMeans& m) {
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
  loop_.metrics().write("ppo", p.step, {{"reward", reward},
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
  loop_.progress().update(p.progress_done, "reward " + std::to_string(reward) + ", kl " + std::to_string(result_.mean_kl));

  monitor::StepFigures health;
  health.step = p.step;
  // The value loss is positive, so a spike is measurable; a non-finite actor loss is reported too.
  health.loss = std::isfinite(actor_loss) ? critic_loss : actor_loss;
  if (p.skipped_engine_steps > 0) health.grad_norm = -1.0;
  if (p.non_finite_weights.defined()) health.non_finite_weights = p.non_finite_weights.item<double>();
  health.kl = result_.mean_kl;
  health.entropy = all_reduce_mean(context_, m.entropy);
  health.mean_answer_tokens = answer_len;
  health.min_answer_tokens = config_.min_answer_tokens;
  health.max_answer_tokens = config_.max_answer_seq_len;
  health.repeated_share = all_reduce_mean(context_, repeated_answer_share(answers));
  health.reward = reward;
  loop_.check_step(health, p.epoch, p.first_batch, p.end_batch);
}

}  // namespace rlhf
}  // namespace dschat
