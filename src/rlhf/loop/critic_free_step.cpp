#include "rlhf/loop/critic_free_step.h"

#include "dschat/core/error.h"
#include "dschat/core/host_sync.h"
#include "dschat/rlhf/math/ppo_math.h"
#include "dschat/rlhf/setup/step_setup.h"

namespace dschat {
namespace rlhf {
namespace {

bool kl_in_reward(const GrpoConfig& c) { return c.kl_coef > 0.0 && c.kl_mode == KlMode::kReward; }

torch::Tensor rows_of(const torch::Tensor& t, const torch::Tensor& rows) {
  return t.defined() ? t.index_select(0, rows.to(t.device())) : t;
}

// [N, W] -> [N, width]: `value` appended on the right.
torch::Tensor pad_columns(const torch::Tensor& t, int64_t width, double value) {
  if (!t.defined() || t.size(1) == width) return t;
  return torch::constant_pad_nd(t, {0, width - t.size(1)}, value);
}

// Every rank's [N, ...] rows in rank order: [world * N, ...] (equal N on every rank).
torch::Tensor gather_rows(const torch::Tensor& local, const StepContext& context) {
  const int64_t world = context_world(context);
  if (world == 1) return local;
  const torch::Tensor flat = local.contiguous().view({-1});  // [N * ...]
  torch::Tensor all = torch::empty({world * flat.numel()}, flat.options());  // [world * N * ...]
  context.communicator->all_gather_into(all, flat);
  std::vector<int64_t> shape = local.sizes().vec();
  shape[0] *= world;
  return all.view(shape);
}

torch::Tensor own_rows(const torch::Tensor& all, int64_t rows, const StepContext& context) {
  return all.narrow(0, context_rank(context) * rows, rows);
}

}  // namespace

void prepare_answers(CriticFreeBatch& batch) {
  const Experience& exp = batch.exp;
  const int64_t p = exp.prompt_length;
  batch.answer_mask = exp.attention_mask.slice(1, p).to(torch::kFloat32);  // [N, T]
  batch.old_logps = exp.logprobs.slice(1, p - 1);                          // [N, T]
  if (exp.ref_logprobs.defined()) batch.ref_logps = exp.ref_logprobs.slice(1, p - 1);  // [N, T]
  torch::Tensor lengths = batch.answer_mask.sum(1).to(torch::kInt64);  // [N]
  core::HostSync sync("critic-free step (answer lengths, once per batch)");
  lengths = lengths.cpu();
  batch.answer_tokens.assign(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + lengths.numel());
}

void compute_advantages(const GrpoConfig& config, const torch::Tensor& weights, CriticFreeBatch& batch,
                        const StepContext& context) {
  const torch::Device device = batch.exp.seq.device();
  const int64_t rows = batch.exp.rows(), n = config.n_samples_per_prompt;
  DSCHAT_CHECK(rows % n == 0, InvalidArgument, "critic-free step: ", rows, " answers are not whole groups of ", n);
  torch::Tensor kl_tokens;  // [N, T]: the per-token KL of the sampled answers (kl_mode "reward")
  if (kl_in_reward(config)) {
    DSCHAT_CHECK(batch.ref_logps.defined(), InvalidArgument, "critic-free step: kl_coef > 0 needs the reference");
    kl_tokens = approx_kl(batch.old_logps, batch.ref_logps, config.kl_estimator) * batch.answer_mask;
  }
  const AdvantageEstimator estimator = config.advantage_estimator;
  const bool grpo = estimator == AdvantageEstimator::kGrpo;
  if (grpo || estimator == AdvantageEstimator::kRloo) {
    torch::Tensor rewards = batch.rewards_per_source;  // [N, F]
    torch::Tensor w = weights;                          // [F]
    torch::Tensor kl_sums;                              // [N] on the CPU
    if (kl_tokens.defined()) kl_sums = kl_tokens.sum(1).to(torch::kCPU, torch::kFloat32);
    if (grpo && kl_sums.defined()) {
      // The KL penalty as one more weighted reward column: R = Σ_f w_f r_f - kl_coef·Σ_t kl_t.
      rewards = torch::cat({rewards, -kl_sums.unsqueeze(1)}, 1);                          // [N, F+1]
      w = torch::cat({w, torch::tensor({static_cast<float>(config.kl_coef)}, torch::kFloat32)});  // [F+1]
    }
    const torch::Tensor all_rewards = gather_rows(rewards, context);  // [world * N, F']
    torch::Tensor advantages;
    if (grpo) {
      advantages = grpo_advantages(all_rewards, w, n, config.scale_rewards);
    } else {
      const torch::Tensor all_kl = kl_sums.defined() ? gather_rows(kl_sums, context) : kl_sums;
      advantages = rloo_advantages(all_rewards, w, n, kl_sums.defined() ? config.kl_coef : 0.0, all_kl,
                                   config.normalize_advantages);
    }
    batch.advantages = own_rows(advantages, rows, context).to(device, torch::kFloat32);  // [N]
    return;
  }
  ReinforceOptions options;
  options.estimator =
      estimator == AdvantageEstimator::kReinforcePp ? ReinforceEstimator::kReinforce : ReinforceEstimator::kReinforceBaseline;
  options.samples_per_prompt = n;
  options.kl_coef = kl_tokens.defined() ? config.kl_coef : 0.0;
  torch::Tensor scalar = (batch.rewards_per_source * weights).sum(1).to(device);  // [N]
  torch::Tensor kl = kl_tokens.defined() ? approx_kl(batch.old_logps, batch.ref_logps, config.kl_estimator)
                                         : torch::Tensor();  // [N, T]
  torch::Tensor mask = batch.answer_mask;                    // [N, T]
  const int64_t world = context_world(context), width = mask.size(1);
  if (world > 1) {
    // OpenRLHF normalises over the whole batch of every data-parallel rank (its replay buffer
    // all-reduces the mean and variance): every rank's rows, right padded to max_answer_seq_len
    // (a width every rank knows without asking; padding is masked out of the statistics), then
    // this rank's rows and columns back.
    const int64_t common = config.max_answer_seq_len;
    DSCHAT_CHECK(width <= common, InvalidArgument, "critic-free step: ", width,
                 " answer columns exceed max_answer_seq_len ", common);
    scalar = gather_rows(scalar, context);                        // [world * N]
    mask = gather_rows(pad_columns(mask, common, 0.0), context);  // [world * N, T']
    if (kl.defined()) kl = gather_rows(pad_columns(kl, common, 0.0), context);  // [world * N, T']
  }
  torch::Tensor advantages = reinforce_advantages(scalar, kl, mask, options).advantages;  // [world * N, T']
  if (world > 1) advantages = own_rows(advantages, rows, context).narrow(1, 0, width).contiguous();
  batch.advantages = advantages;  // [N, T]
}

CriticFreeMicroStats critic_free_micro_step(hybrid::HybridEngine& actor, const GrpoConfig& config,
                                            const CriticFreeBatch& batch, const torch::Tensor& rows,
                                            double window_tokens) {
  const Experience& exp = batch.exp;
  const int64_t p = exp.prompt_length;
  const torch::Tensor seq = rows_of(exp.seq, rows);                   // [b, L]
  const torch::Tensor attention = rows_of(exp.attention_mask, rows);  // [b, L]
  const torch::Tensor mask = rows_of(batch.answer_mask, rows);        // [b, T]
  const torch::Tensor old = rows_of(batch.old_logps, rows);           // [b, T]
  const torch::Tensor ref = rows_of(batch.ref_logps, rows);           // [b, T] or undefined
  const torch::Tensor advantages = rows_of(batch.advantages, rows);   // [b] or [b, T]

  torch::Tensor logits = actor.actor()->forward(seq, attention, exp.mask_layout);  // [b, L, V]
  // Only the positions that predict answer tokens; the sampling temperature's distribution.
  torch::Tensor answer_logits = logits.slice(1, p - 1, seq.size(1) - 1).to(torch::kFloat32);  // [b, T, V]
  if (config.sampling.temperature != 1.0) answer_logits = answer_logits / config.sampling.temperature;
  const torch::Tensor token_logps = torch::log_softmax(answer_logits, -1);                       // [b, T, V]
  const torch::Tensor logps = token_logps.gather(2, seq.slice(1, p).unsqueeze(2)).squeeze(2);  // [b, T]

  const int64_t world = actor.training_engine().world_size();
  const int64_t gas = config.common.gradient_accumulation_steps;
  PolicyLossOutput out;
  if (config.advantage_estimator == AdvantageEstimator::kRloo) {
    out = rloo_policy_loss(logps, old, mask, advantages, config.clip_low, config.clip_high);
  } else {
    GrpoLossOptions options;
    options.epsilon_low = config.clip_low;
    options.epsilon_high = config.clip_high;
    options.beta = config.kl_mode == KlMode::kLoss ? config.kl_coef : 0.0;
    options.kl_estimator = config.kl_estimator;
    // token-mean: Σ ℓ·m / (window tokens / (world · GAS)); the engine's 1/GAS and its average over
    // the ranks then leave Σ ℓ·m over every rank's window divided by all of their tokens.
    options.type = config.loss_aggregation == LossAggregation::kTokenMean ? GrpoLossType::kDapo : GrpoLossType::kGrpo;
    options.num_items_in_batch = window_tokens;
    options.num_processes = world * gas;
    options.gradient_accumulation_steps = 1;  // sequence-mean: the engine divides by GAS
    out = grpo_policy_loss(logps, old, options.beta > 0.0 ? ref : torch::Tensor(), mask, advantages, options);
  }
  actor.backward(out.loss);
  actor.step();

  CriticFreeMicroStats stats;
  torch::NoGradGuard no_grad;
  stats.loss = out.loss.detach();
  stats.clip_fraction = out.clip_fraction;
  const torch::Tensor entropy = -(token_logps.exp() * token_logps).sum(-1);  // [b, T]
  stats.entropy = masked_mean(entropy, mask);
  stats.kl = ref.defined() ? masked_mean(approx_kl(logps.detach(), ref, config.kl_estimator), mask)
                           : torch::zeros({}, logps.options());
  return stats;
}

std::vector<int64_t> host_indices(const torch::Tensor& rows) {
  const torch::Tensor host = rows.to(torch::kCPU, torch::kInt64).contiguous();  // [K]; host tensors are not copied
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

CriticFreeBatch select_rows(const CriticFreeBatch& batch, const torch::Tensor& rows) {
  CriticFreeBatch out = batch;
  out.exp = batch.exp.select(rows);
  out.rewards_per_source = rows_of(batch.rewards_per_source, rows);
  out.answer_mask = rows_of(batch.answer_mask, rows);
  out.old_logps = rows_of(batch.old_logps, rows);
  out.ref_logps = rows_of(batch.ref_logps, rows);
  out.advantages = rows_of(batch.advantages, rows);
  out.answer_tokens.clear();
  for (int64_t row : host_indices(rows)) out.answer_tokens.push_back(batch.answer_tokens.at(static_cast<size_t>(row)));
  return out;
}

CriticFreeBatch concatenate(const std::vector<CriticFreeBatch>& parts, int64_t pad_token_id) {
  DSCHAT_CHECK(!parts.empty(), InvalidArgument, "critic-free step: nothing to concatenate");
  if (parts.size() == 1) return parts.front();
  int64_t width = 0;
  for (const CriticFreeBatch& b : parts) width = std::max(width, b.exp.seq.size(1));
  const int64_t p = parts.front().exp.prompt_length;
  auto cat = [&](auto field, int64_t columns, double value) {
    std::vector<torch::Tensor> pieces;
    for (const CriticFreeBatch& b : parts) {
      const torch::Tensor t = field(b);
      if (!t.defined()) return torch::Tensor();
      pieces.push_back(columns > 0 ? pad_columns(t, columns, value) : t);
    }
    return torch::cat(pieces, 0);
  };
  CriticFreeBatch out = parts.front();
  Experience& e = out.exp;
  e.seq = cat([](const CriticFreeBatch& b) { return b.exp.seq; }, width, static_cast<double>(pad_token_id));
  e.attention_mask = cat([](const CriticFreeBatch& b) { return b.exp.attention_mask; }, width, 0.0);
  e.logprobs = cat([](const CriticFreeBatch& b) { return b.exp.logprobs; }, width - 1, 0.0);
  e.ref_logprobs = cat([](const CriticFreeBatch& b) { return b.exp.ref_logprobs; }, width - 1, 0.0);
  e.values = torch::Tensor();
  e.reward_score = cat([](const CriticFreeBatch& b) { return b.exp.reward_score; }, 0, 0.0);
  e.prompt_index = cat([](const CriticFreeBatch& b) { return b.exp.prompt_index; }, 0, 0.0);
  e.mask_layout = nn::MaskLayout::kLeftPadded;  // answers now end in padding of different lengths
  e.generated_rows = 0;
  e.generate_seconds = 0.0;
  for (const CriticFreeBatch& b : parts) {
    e.generated_rows += b.exp.generated_rows;
    e.generate_seconds += b.exp.generate_seconds;
  }
  out.rewards_per_source = cat([](const CriticFreeBatch& b) { return b.rewards_per_source; }, 0, 0.0);
  out.answer_mask = cat([](const CriticFreeBatch& b) { return b.answer_mask; }, width - p, 0.0);
  out.old_logps = cat([](const CriticFreeBatch& b) { return b.old_logps; }, width - p, 0.0);
  out.ref_logps = cat([](const CriticFreeBatch& b) { return b.ref_logps; }, width - p, 0.0);
  out.advantages = torch::Tensor();  // computed over the concatenation
  out.answer_tokens.clear();
  for (const CriticFreeBatch& b : parts) {
    out.answer_tokens.insert(out.answer_tokens.end(), b.answer_tokens.begin(), b.answer_tokens.end());
  }
  return out;
}

}  // namespace rlhf
}  // namespace dschat
