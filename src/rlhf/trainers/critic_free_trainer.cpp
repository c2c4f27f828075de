#include "dschat/rlhf/trainers/critic_free_trainer.h"

#include <algorithm>
#include <random>

#include "core/stopwatch.h"
#include "dschat/core/host_sync.h"
#include "dschat/rlhf/loop/policy_loop.h"
#include "dschat/rlhf/rewards/reward_sources.h"
#include "dschat/rlhf/setup/rlhf_models.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "rlhf/loop/critic_free_step.h"
#include "rlhf/trainers/critic_free_support.h"
#include "rlhf/setup/memory_hint.h"
#include "rlhf/loop/policy_guard.h"

namespace dschat {
namespace rlhf {
namespace {

namespace fs = std::filesystem;
using Clock = core::SteadyClock;
using core::seconds_since;

// The optimizer windows of one pass: for each micro-batch, the answer tokens of its window of
// gradient_accumulation_steps micro-batches summed over every rank (one all-reduce per pass).
std::vector<double> window_tokens(const std::vector<torch::Tensor>& micro, const CriticFreeBatch& batch, int64_t gas,
                                  const StepContext& context) {
  const int64_t windows = (static_cast<int64_t>(micro.size()) + gas - 1) / gas;
  torch::Tensor sums = torch::zeros({windows}, torch::kFloat64);  // [W]
  for (size_t i = 0; i < micro.size(); ++i) {
    double tokens = 0.0;
    for (int64_t r : host_indices(micro[i])) tokens += static_cast<double>(batch.answer_tokens.at(static_cast<size_t>(r)));
    sums[static_cast<int64_t>(i) / gas] += tokens;
  }
  if (context.communicator && context.communicator->world_size() > 1) context.communicator->all_reduce(sums);
  std::vector<double> out;
  for (size_t i = 0; i < micro.size(); ++i) out.push_back(sums[static_cast<int64_t>(i) / gas].item<double>());
  return out;
}

// The critic-free step (GRPO, RLOO, REINFORCE++) as a PolicyLoop algorithm: sampled and scored
// groups of answers pooled until the step is full (dynamic sampling), the estimator's
// advantages, then ppo_epochs shuffled passes of clipped policy-gradient micro-steps.
class CriticFreeAlgorithm : public PolicyAlgorithm {
 public:
  CriticFreeAlgorithm(const GrpoConfig& config, const StepContext& context, const tokenizer::Tokenizer& tokenizer,
                      RlhfModels& models)
      : config_(config), context_(context), tokenizer_(tokenizer), models_(models), pad_(pad_token_of(tokenizer)),
        eos_(tokenizer.eos_token_id().value_or(pad_)), reward_(config, context, models.placement, tokenizer, pad_),
        weights_(reward_.sources().weights()) {}

  const GrpoResult& result() const { return result_; }

  torch::Device device() const override { return models_.placement.trained.device; }
  std::vector<engine::TrainingEngine*> engines() override { return {&models_.actor->training_engine()}; }
  std::vector<std::string> other_parts() const override { return {"ema"}; }
  void save_parts(const fs::path& dir, const std::string& tag, engine::AsyncCheckpointWriter* background) override {
    if (models_.has_ema()) {
      const std::map<std::string, torch::Tensor> ema = ema_parameters(models_);  // collective
      if (context_rank(context_) == 0) save_ema_checkpoint(dir / "ema", tag, ema, background);
    }
  }
  void load_parts(const fs::path& dir, const std::string& tag) override { load_ema_checkpoint(models_, dir / "ema", tag); }
  nlohmann::json state() const override {
    return {{"step_rewards", result_.step_rewards},
            {"step_group_std", result_.step_group_std},
            {"dropped_groups", result_.dropped_groups}};
  }
  void restore(const nlohmann::json& state) override {
    result_.step_rewards = state.at("step_rewards").get<std::vector<double>>();
    result_.step_group_std = state.at("step_group_std").get<std::vector<double>>();
    result_.dropped_groups = state.at("dropped_groups").get<int64_t>();
  }
  double heldout_score(const data::PromptBatch& prompts) override {
    return rlhf::heldout_score(models_, reward_, config_, prompts, eos_, pad_, config_.common.guardian.heldout_source);
  }
  void start(PolicyLoop& loop) override {
    loop_ = &loop;
    result_.resumed = loop.resumed();
  }

  Collected collect(const data::PromptBatch& batch, const PolicyBatch& at) override {
    pool_.push_back(sample_and_score(models_, reward_, config_, batch, eos_, pad_, at.sample_seed));
    ready_ = take_step_answers(pool_, static_cast<int64_t>(pool_.size()), config_, weights_,
                               config_.per_device_generation_batch_size, pad_, context_);
    if (!ready_) return Collected::kCollected;
    pool_.clear();
    return Collected::kStepReady;
  }
  std::optional<monitor::StepFigures> train(const PolicyStep& step) override;
  void drop_collected() override {
    pool_.clear();
    ready_.reset();
  }
  void save_outputs(int64_t steps) override {
    result_.steps = steps;
    result_.seconds = seconds_since(start_);
    save_rl_outputs(models_, tokenizer_, config_.output_dir, result_.to_json(), context_, config_.actor_model_name_or_path,
                  config_.common.save_format);
  }

 private:
  // ppo_epochs passes over the answers in micro-batches of per_device_training_batch_size (the
  // order shuffled from the second pass on); the EMA follows every micro-step.
  std::vector<CriticFreeMicroStats> train_passes(const CriticFreeBatch& answers, int64_t steps_done);
  // The guardian's view of the step.
  monitor::StepFigures health_of(const StepFigures& f, const CriticFreeBatch& answers, int64_t step,
                                 int64_t skipped_before);

  const GrpoConfig& config_;
  const StepContext& context_;
  const tokenizer::Tokenizer& tokenizer_;
  RlhfModels& models_;
  const int64_t pad_, eos_;
  ScoredReward reward_;
  const torch::Tensor weights_;  // [F] the reward sources' weights
  const core::SteadyClock::time_point start_ = Clock::now();
  PolicyLoop* loop_ = nullptr;
  GrpoResult result_;
  std::vector<CriticFreeBatch> pool_;  // dynamic sampling: this step's batches so far
  std::optional<StepAnswers> ready_;   // the step's answers, once the pool is full
};

std::vector<CriticFreeMicroStats> CriticFreeAlgorithm::train_passes(const CriticFreeBatch& answers, int64_t steps_done) {
  const int64_t train_bs = config_.per_device_training_batch_size;
  std::vector<CriticFreeMicroStats> micro_stats;
  std::mt19937_64 shuffle_rng(config_.common.seed + static_cast<uint64_t>(steps_done));
  std::vector<int64_t> order(static_cast<size_t>(answers.exp.rows()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  for (int64_t pass = 0; pass < config_.ppo_epochs; ++pass) {
    if (pass > 0) std::shuffle(order.begin(), order.end(), shuffle_rng);
    std::vector<torch::Tensor> micro;  // each [b] int64 row indices on the host
    for (size_t b = 0; b < order.size(); b += static_cast<size_t>(train_bs)) {
      const size_t e = std::min(order.size(), b + static_cast<size_t>(train_bs));
      micro.push_back(torch::tensor(std::vector<int64_t>(order.begin() + static_cast<std::ptrdiff_t>(b),
                                                         order.begin() + static_cast<std::ptrdiff_t>(e)),
                                    torch::kInt64));
    }
    const std::vector<double> tokens =
        window_tokens(micro, answers, config_.common.gradient_accumulation_steps, context_);
    for (size_t i = 0; i < micro.size(); ++i) {
      micro_stats.push_back(critic_free_micro_step(*models_.actor, config_, answers, micro[i], tokens[i]));
      if (models_.has_ema()) update_ema(models_, kEmaBeta);
    }
  }
  return micro_stats;
}

monitor::StepFigures CriticFreeAlgorithm::health_of(const StepFigures& f, const CriticFreeBatch& answers, int64_t step,
                                                    int64_t skipped_before) {
  monitor::StepFigures health;
  health.step = step;
  health.loss = f.loss;
  engine::TrainingEngine& actor_engine = models_.actor->training_engine();
  if (!actor_engine.uses_loss_scaling() && actor_engine.skipped_steps() > skipped_before) health.grad_norm = -1.0;
  if (loop_->guard().checks_weights()) health.non_finite_weights = actor_engine.non_finite_weight_count().item<double>();
  if (config_.kl_coef > 0.0) health.kl = f.kl;
  health.entropy = f.entropy;
  health.mean_answer_tokens = f.answer_tokens;
  health.max_answer_tokens = config_.max_answer_seq_len;
  // One answer per prompt (the first of its group): the same answer to different prompts is the
  // collapse; a group's answers agreeing is just a confident policy.
  std::vector<std::string> firsts;
  const std::vector<RewardQuery> queries = reward_.queries(answers.exp.seq, answers.exp.prompt_length);
  for (size_t i = 0; i < queries.size(); i += static_cast<size_t>(config_.n_samples_per_prompt)) {
    firsts.push_back(queries[i].response);
  }
  health.repeated_share = loop_->guard().mean_over_ranks({repeated_answer_share(firsts)})[0];
  health.reward = f.reward;
  return health;
}

std::optional<monitor::StepFigures> CriticFreeAlgorithm::train(const PolicyStep& step) {
  const StepAnswers ready = std::move(*ready_);
  ready_.reset();
  result_.dropped_groups += ready.dropped_groups;
  CriticFreeBatch answers = ready.batch;
  compute_advantages(config_, weights_, answers, context_);
  const int64_t rank = context_rank(context_);
  if (config_.print_answers && rank == 0 && (step.step - 1) % config_.print_answers_interval == 0) {
    print_answers(answers, reward_, weights_);
  }
  const auto train_start = Clock::now();
  const int64_t skipped_before = models_.actor->training_engine().skipped_steps();
  const std::vector<CriticFreeMicroStats> micro_stats = train_passes(answers, step.step - 1);
  const double train_seconds = seconds_since(train_start);
  const StepFigures f =
      read_step(answers, weights_, config_.n_samples_per_prompt, micro_stats, ready.kept_share, context_);
  result_.step_rewards.push_back(f.reward);
  result_.step_group_std.push_back(f.group_std);
  result_.mean_kl = f.kl;
  result_.mean_entropy = f.entropy;
  for (int64_t s = 0; s < reward_.sources().size(); ++s) {
    result_.last_source_means[reward_.sources().config(s).name] = f.source_means[static_cast<size_t>(s)];
  }
  result_.generate_seconds += answers.exp.generate_seconds;
  result_.train_seconds += train_seconds;
  log_step(loop_->metrics(), config_, reward_.sources(), step.step, step.epoch, f, answers.exp.generate_seconds,
           train_seconds, rank);
  loop_->progress().update(step.progress_done, "reward " + std::to_string(f.reward));
  return health_of(f, answers, step.step, skipped_before);
}

// "step 2 (grpo)": the step's name in messages and out-of-memory errors.
std::string critic_free_step_name(const GrpoConfig& config) {
  return std::string("step 2 (") + mode_name(config.advantage_estimator) + ")";
}

PolicyLoopSettings critic_free_loop_settings(const GrpoConfig& config) {
  PolicyLoopSettings settings;
  settings.where = critic_free_step_name(config);
  settings.progress_name = settings.where;
  settings.output_dir = config.output_dir;
  settings.common = config.common;
  settings.generation_batch_size = config.per_device_generation_batch_size;
  settings.generation_batches = 1;  // a step takes as many batches as its pool needs
  settings.prompt_length = config.max_prompt_seq_len;
  settings.steps_span_epochs = false;  // a pool not full at an epoch's end is dropped
  return settings;
}

GrpoResult run_grpo_phases(const GrpoConfig& config, const StepContext& context) {
  PolicyLoop loop(critic_free_loop_settings(config), context);
  const std::string& where = loop.settings().where;
  std::optional<core::HostSync> setup_sync(std::in_place, "step setup (models, engines, data)");
  torch::manual_seed(config.common.seed);

  auto tokenizer = load_step_tokenizer(context, config.actor_model_name_or_path);
  const int64_t pad = pad_token_of(tokenizer);
  const int64_t p_len = config.max_prompt_seq_len, n = config.n_samples_per_prompt;
  const data::PhaseData phase = data::create_prompt_dataset(
      prompt_data_options(config.data, 3, config.common.seed, p_len, eos_text_of(tokenizer)), tokenizer);
  loop.set_prompts(phase, pad);
  const int64_t gen_bs = config.per_device_generation_batch_size, train_bs = config.per_device_training_batch_size;
  const int64_t gas = config.common.gradient_accumulation_steps;
  const int64_t micro_per_step = (gen_bs * n + train_bs - 1) / train_bs;
  // An optimizer window must not straddle two steps: its token count (token-mean) and the
  // checkpoint after each step both assume every pass ends on an accumulation boundary.
  DSCHAT_CHECK(micro_per_step % gas == 0, ConfigError, where, ": gradient_accumulation_steps ", gas,
               " must divide the micro-batches of a pass, ", micro_per_step, " (n_samples_per_prompt ", n,
               " x per_device_generation_batch_size ", gen_bs, " answers in micro-batches of ", train_bs, ")");
  const int64_t total_iters = std::max<int64_t>(
      1, config.common.num_train_epochs * loop.steps_per_epoch() * config.ppo_epochs * micro_per_step / gas);
  RlhfModels models = build_policy_models(config, total_iters, gas, context, config.kl_coef > 0.0, where);
  check_vocab(models.actor->actor()->config().vocab_size, tokenizer, config.actor_model_name_or_path);
  check_sequence_length(models.actor->actor()->config(), config.max_prompt_seq_len + config.max_answer_seq_len,
                        where + ": keys 'max_prompt_seq_len' + 'max_answer_seq_len'", config.actor_model_name_or_path);
  CriticFreeAlgorithm algorithm(config, context, tokenizer, models);
  setup_sync.reset();
  loop.run(algorithm);
  return algorithm.result();
}

}  // namespace

nlohmann::json GrpoResult::to_json() const {
  return {{"step_rewards", step_rewards},   {"step_group_std", step_group_std}, {"source_means", last_source_means},
          {"mean_kl", mean_kl},             {"mean_entropy", mean_entropy},     {"steps", steps},
          {"dropped_groups", dropped_groups}, {"generate_seconds", generate_seconds},
          {"train_seconds", train_seconds}, {"seconds", seconds}};
}

GrpoResult run_grpo(const GrpoConfig& config, const StepContext& context) {
  MemoryPhase memory{critic_free_step_name(config), "actor " + config.actor_model_name_or_path,
                     "loading the actor and its reference"};
  return with_memory_hint(memory, [&] { return run_grpo_phases(config, context); });
}

}  // namespace rlhf
}  // namespace dschat
