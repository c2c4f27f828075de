#include "dschat/rlhf/setup/experience.h"

#include "core/stopwatch.h"
#include "dschat/core/error.h"
#include "dschat/core/host_sync.h"
#include "dschat/rlhf/math/ppo_math.h"
#include "dschat/rlhf/math/reward_loss.h"

namespace dschat {
namespace rlhf {
namespace {

// One read of a sequence batch's mask (a device sync, named): unpadded batches take SDPA's causal
// path in every forward that follows instead of a dense [B, 1, L, L] bias.
nn::MaskLayout mask_layout_of(const torch::Tensor& attention_mask) {
  core::HostSync sync("experience (padding layout, once per batch and scorer)");
  return nn::detect_mask_layout(attention_mask);
}

}  // namespace

namespace {

// `exp` with `take` applied to every defined per-row tensor.
template <typename Take>
Experience map_rows(const Experience& exp, Take take) {
  auto rows = [&](const torch::Tensor& t) { return t.defined() ? take(t) : t; };
  Experience out = exp;
  out.seq = rows(exp.seq);
  out.attention_mask = rows(exp.attention_mask);
  out.logprobs = rows(exp.logprobs);
  out.ref_logprobs = rows(exp.ref_logprobs);
  out.values = rows(exp.values);
  out.reward_score = rows(exp.reward_score);
  out.prompt_index = rows(exp.prompt_index);
  return out;
}

}  // namespace

Experience Experience::slice(int64_t begin, int64_t end) const {
  return map_rows(*this, [&](const torch::Tensor& t) { return t.slice(0, begin, end); });
}

Experience Experience::select(const torch::Tensor& rows) const {
  return map_rows(*this, [&](const torch::Tensor& t) { return t.index_select(0, rows.to(t.device())); });
}

RewardFunction reward_model_scores(models::ValueHeadModel reward, int64_t pad_token_id,
                                   engine::ZeroInferenceEngine* engine) {
  return [reward, pad_token_id, engine](const torch::Tensor& seq, const torch::Tensor& attention_mask,
                                        int64_t prompt_length) mutable {
    reward->eval();
    // Scored where the model is (offload_reward_model keeps it on the CPU), returned on seq's device.
    const torch::Device at = parameter_device(*reward);
    const torch::Tensor ids = seq.to(at);  // [B, L]
    const torch::Tensor mask = attention_mask.to(at);
    torch::Tensor values = reward->forward(ids, mask, mask_layout_of(mask)).to(torch::kFloat32);  // [B, L]
    if (engine != nullptr) engine->release_gathered_parameters();
    return reward_end_scores(ids, values, pad_token_id, prompt_length).to(seq.device());     // [B]
  };
}

core::GenerationConfig experience_generation_config(const PolicyStepConfig& config, int64_t eos_token_id,
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

namespace {

// The scoring forwards are collective under ZeRO-3: every rank scores, or none does. Once per
// experience batch, on the host: has_rows is already a host value (the filter's nonzero had to
// size its result), and the all-reduce of a CPU tensor goes through Gloo, not the GPU.
bool every_rank_has_rows(engine::TrainingEngine& policy_engine, bool has_rows) {
  const auto& comm = policy_engine.communicator();
  if (!comm || comm->world_size() <= 1) return has_rows;
  torch::Tensor have = torch::tensor({has_rows ? 1.0 : 0.0}, torch::kFloat64);  // [1]
  comm->all_reduce(have, dist::ReduceOp::Sum);
  return have.item<double>() == static_cast<double>(comm->world_size());
}

// The log-probs of seq [K, L] under `model`, computed where the model is (offload_reference_model
// keeps the reference on the CPU) and returned on seq's device: [K, L-1].
torch::Tensor log_probs_on_model_device(models::CausalLM& model, const torch::Tensor& seq,
                                        const torch::Tensor& attention_mask, nn::MaskLayout layout) {
  const torch::Device at = parameter_device(*model);
  return sequence_log_probs(model, seq.to(at), attention_mask.to(at), layout).to(seq.device());
}

}  // namespace

std::optional<Experience> generate_experience(ExperienceSources& sources, const torch::Tensor& prompts,
                                              const torch::Tensor& prompt_mask, const ExperienceOptions& options) {
  DSCHAT_CHECK(sources.policy != nullptr, InvalidArgument, "generate_experience: sources.policy is null");
  DSCHAT_CHECK(static_cast<bool>(sources.reward), InvalidArgument, "generate_experience: sources.reward is empty");
  const auto start = core::SteadyClock::now();
  hybrid::HybridEngine& policy = *sources.policy;
  // Host prompts (a collated batch) go to the policy; already there, they are used as they are.
  const torch::Device device = parameter_device(*policy.actor());
  const torch::Tensor prompt_ids = prompts.to(device, /*non_blocking=*/true);             // [B, P]
  const torch::Tensor prompt_attention = prompt_mask.to(device, /*non_blocking=*/true);  // [B, P]
  policy.eval();
  torch::Tensor seq = policy.generate(prompt_ids, prompt_attention, options.generation).sequences;  // [B * n, P + N]
  policy.train();
  Experience exp;
  exp.prompt_length = prompts.size(1);
  exp.generated_rows = seq.size(0);
  exp.generate_seconds = core::seconds_since(start);
  const int64_t n = options.generation.num_return_sequences;
  torch::Tensor prompt_index =
      torch::arange(prompts.size(0), torch::dtype(torch::kInt64).device(seq.device())).repeat_interleave(n);  // [B * n]

  torch::Tensor keep;  // [K] rows kept
  // Dropping short answers changes the row count, which the host must know (a read, named).
  std::optional<core::HostSync> filter_sync(std::in_place, "experience (answer filter)");
  if (options.drop_short_answers) {
    keep = answer_keep_rows(seq, exp.prompt_length, options.pad_token_id, options.min_answer_tokens);
  } else {
    keep = torch::arange(seq.size(0), torch::dtype(torch::kInt64).device(seq.device()));
  }
  if (!every_rank_has_rows(policy.training_engine(), keep.numel() > 0)) return std::nullopt;
  if (keep.numel() < seq.size(0)) {
    seq = seq.index_select(0, keep);
    prompt_index = prompt_index.index_select(0, keep.to(prompt_index.device()));
  }
  filter_sync.reset();
  exp.seq = seq;                                                             // [K, L]
  exp.attention_mask = (seq != options.pad_token_id).to(torch::kInt64);    // [K, L]
  exp.prompt_index = prompt_index;                                           // [K]
  exp.mask_layout = mask_layout_of(exp.attention_mask);

  torch::NoGradGuard no_grad;
  exp.logprobs = sequence_log_probs(policy.actor(), seq, exp.attention_mask, exp.mask_layout);  // [K, L-1]
  policy.training_engine().release_gathered_parameters();
  if (sources.reference) {
    sources.reference->eval();
    exp.ref_logprobs = log_probs_on_model_device(sources.reference, seq, exp.attention_mask, exp.mask_layout);  // [K, L-1]
    if (sources.reference_engine != nullptr) sources.reference_engine->release_gathered_parameters();
  }
  exp.reward_score =
      sources.reward(seq, exp.attention_mask, exp.prompt_length).to(seq.device(), torch::kFloat32);  // [K]
  DSCHAT_CHECK(exp.reward_score.dim() == 1 && exp.reward_score.size(0) == seq.size(0), InvalidArgument,
               "generate_experience: the reward function returned ", exp.reward_score.sizes(), " for ",
               seq.size(0), " sequences; expected [", seq.size(0), "]");
  if (sources.critic) {
    torch::Tensor values =
        sources.critic->forward(seq, exp.attention_mask, exp.mask_layout).to(torch::kFloat32);  // [K, L]
    if (sources.critic_engine != nullptr) sources.critic_engine->release_gathered_parameters();
    exp.values = values.slice(1, 0, -1);  // [K, L-1]
  }
  return exp;
}

std::optional<Experience> make_experience(RlhfModels& models, const torch::Tensor& prompts,
                                          const torch::Tensor& prompt_mask, const core::GenerationConfig& generation,
                                          int64_t pad_token_id, int64_t min_answer_tokens) {
  ExperienceSources sources;
  sources.policy = models.actor.get();
  sources.reference = models.ref;
  sources.reference_engine = models.ref_engine.get();
  sources.reward = reward_model_scores(models.reward, pad_token_id, models.reward_engine.get());
  sources.critic = models.critic;
  sources.critic_engine = models.critic_engine.get();
  ExperienceOptions options;
  options.generation = generation;
  options.pad_token_id = pad_token_id;
  options.min_answer_tokens = min_answer_tokens;
  return generate_experience(sources, prompts, prompt_mask, options);
}

}  // namespace rlhf
}  // namespace dschat
