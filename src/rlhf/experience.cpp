#include "rlhf/experience.h"

#include <chrono>

#include "dschat/rlhf/ppo_math.h"
#include "dschat/rlhf/reward_loss.h"

namespace dschat {
namespace rlhf {

Experience Experience::slice(int64_t begin, int64_t end) const {
  Experience out = *this;
  out.seq = seq.slice(0, begin, end);
  out.attention_mask = attention_mask.slice(0, begin, end);
  out.logprobs = logprobs.slice(0, begin, end);
  out.ref_logprobs = ref_logprobs.slice(0, begin, end);
  out.values = values.slice(0, begin, end);
  out.reward_score = reward_score.slice(0, begin, end);
  return out;
}

torch::Tensor gather_log_probs(const torch::Tensor& logits, const torch::Tensor& labels) {
  torch::Tensor log_probs = torch::log_softmax(logits.slice(1, 0, -1).to(torch::kFloat32), -1);  // [B, L-1, V]
  return log_probs.gather(-1, labels.slice(1, 1).unsqueeze(-1)).squeeze(-1);                     // [B, L-1]
}

core::GenerationConfig experience_generation_config(const PpoConfig& config, int64_t eos_token_id,
                                                    int64_t pad_token_id, uint64_t seed) {
  core::GenerationConfig generation;
  generation.max_new_tokens = config.max_answer_seq_len;
  generation.do_sample = config.sampling.do_sample;
  generation.temperature = config.sampling.temperature;
  generation.top_k = config.sampling.top_k;
  generation.top_p = config.sampling.top_p;
  generation.eos_token_id = eos_token_id;
  generation.pad_token_id = pad_token_id;
  generation.seed = seed;
  return generation;
}

std::optional<Experience> make_experience(RlhfModels& models, const torch::Tensor& prompts,
                                          const torch::Tensor& prompt_mask, const core::GenerationConfig& generation,
                                          int64_t pad_token_id, int64_t min_answer_tokens) {
  const auto start = std::chrono::steady_clock::now();
  models.actor->eval();
  torch::Tensor seq = models.actor->generate(prompts, prompt_mask, generation).sequences;  // [B, P + N]
  models.actor->train();
  Experience exp;
  exp.prompt_length = prompts.size(1);
  exp.generated_rows = seq.size(0);
  exp.generate_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const torch::Tensor keep = answer_keep_rows(seq, exp.prompt_length, pad_token_id, min_answer_tokens);  // [K]
  // The scoring forwards are collective under ZeRO-3: every rank scores, or none does.
  bool all_have_rows = keep.numel() > 0;
  if (const auto& comm = models.actor->training_engine().communicator(); comm && comm->world_size() > 1) {
    torch::Tensor have = torch::tensor({all_have_rows ? 1.0 : 0.0}, torch::kFloat64);
    comm->all_reduce(have, dist::ReduceOp::Sum);
    all_have_rows = have.item<double>() == static_cast<double>(comm->world_size());
  }
  if (!all_have_rows) return std::nullopt;
  if (keep.numel() < seq.size(0)) seq = seq.index_select(0, keep);
  exp.seq = seq;
  exp.attention_mask = (seq != pad_token_id).to(torch::kInt64);  // [K, L]

  torch::NoGradGuard no_grad;
  engine::TrainingEngine& actor_engine = models.actor->training_engine();
  exp.logprobs = gather_log_probs(models.actor->actor()->forward(seq, exp.attention_mask), seq);
  actor_engine.release_gathered_parameters();
  exp.ref_logprobs = gather_log_probs(models.ref->forward(seq, exp.attention_mask), seq);
  torch::Tensor reward_values = models.reward->forward(seq, exp.attention_mask).to(torch::kFloat32);  // [K, L]
  exp.reward_score = reward_end_scores(seq, reward_values, pad_token_id, exp.prompt_length);          // [K]
  torch::Tensor values = models.critic->forward(seq, exp.attention_mask).to(torch::kFloat32);         // [K, L]
  models.critic_engine->release_gathered_parameters();
  exp.values = values.slice(1, 0, -1);  // [K, L-1]
  return exp;
}

}  // namespace rlhf
}  // namespace dschat
