#include "dschat/rlhf/trainers/ppo_trainer.h"

#include <algorithm>
#include <random>

#include "core/log.h"
#include "core/stopwatch.h"
#include "dschat/core/host_sync.h"
#include "dschat/data/collate.h"
#include "dschat/data/epoch_batches.h"
#include "dschat/data/unsupervised.h"
#include "dschat/rlhf/loop/policy_loop.h"
#include "dschat/rlhf/loop/ppo_step.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "rlhf/setup/memory_hint.h"
#include "rlhf/trainers/ppo_reports.h"

namespace dschat {
namespace rlhf {

nlohmann::json PpoResult::to_json() const {
  return {{"step_rewards", step_rewards},     {"reward_ema", reward_ema},
          {"mean_kl", mean_kl},               {"steps", steps},
          {"skipped_batches", skipped_batches}, {"generate_seconds", generate_seconds},
          {"train_seconds", train_seconds},   {"seconds", seconds},
          {"sequences_per_second", sequences_per_second}};
}

namespace {

namespace fs = std::filesystem;
using Clock = core::SteadyClock;
using core::seconds_since;

// PPO as a PolicyLoop algorithm: experience of generation_batches prompt batches (with the
// unsupervised mixture's batches beside them), then ppo_epochs passes over its micro-batches
// training the actor and the critic; the statistics are read when the loop asks (PpoStepReports).
class PpoAlgorithm : public PolicyAlgorithm {
 public:
  /// `unsup_sampler`: this rank's sampler over the mixture's blocks (nullopt: no mixture).
  PpoAlgorithm(const PpoConfig& config, const StepContext& context, const tokenizer::Tokenizer& tokenizer,
               RlhfModels& models, const data::TokenizedDataset& unsup,
               std::optional<data::DistributedSampler> unsup_sampler, MemoryPhase& memory)
      : config_(config), context_(context), tokenizer_(tokenizer), models_(models), unsup_(unsup), memory_(memory),
        pad_(pad_token_of(tokenizer)), eos_(tokenizer.eos_token_id().value_or(pad_)),
        unsup_sampler_(std::move(unsup_sampler)) {}

  const PpoResult& result() const { return result_; }

  torch::Device device() const override { return models_.placement.trained.device; }
  std::vector<engine::TrainingEngine*> engines() override {
    return {&models_.actor->training_engine(), models_.critic_engine.get()};
  }
  std::vector<std::string> other_parts() const override { return {"critic", "ema"}; }
  void save_parts(const fs::path& dir, const std::string& tag, engine::AsyncCheckpointWriter* background) override {
    models_.critic_engine->save_checkpoint(dir / "critic", tag, nlohmann::json::object(), background);
    if (models_.has_ema()) {
      const std::map<std::string, torch::Tensor> ema = ema_parameters(models_);  // collective
      if (context_rank(context_) == 0) save_ema_checkpoint(dir / "ema", tag, ema, background);
    }
  }
  void load_parts(const fs::path& dir, const std::string& tag) override {
    models_.critic_engine->load_checkpoint(dir / "critic", tag);
    load_ema_checkpoint(models_, dir / "ema", tag);
  }
  nlohmann::json state() const override {
    return {{"reward_ema", result_.reward_ema},
            {"step_rewards", result_.step_rewards},
            {"skipped_batches", result_.skipped_batches}};
  }
  void restore(const nlohmann::json& state) override {
    result_.reward_ema = state.at("reward_ema").get<double>();
    result_.step_rewards = state.at("step_rewards").get<std::vector<double>>();
    result_.skipped_batches = state.at("skipped_batches").get<int64_t>();
    have_reward_ema_ = state.at("step").get<int64_t>() > 0;
    if (reports_) reports_->restart(have_reward_ema_);  // a rollback: the unread steps are abandoned
  }

  // The reward model's score of greedy answers to fixed prompts.
  double heldout_score(const data::PromptBatch& prompts) override {
    core::GenerationConfig greedy = experience_generation_config(config_, eos_, pad_, 0);
    greedy.do_sample = false;
    std::optional<Experience> exp =
        make_experience(models_, prompts.input_ids, prompts.attention_mask, greedy, pad_, /*min_answer_tokens=*/0);
    return exp ? exp->reward_score.to(torch::kFloat64).mean().item<double>() : 0.0;
  }

  void start(PolicyLoop& loop) override {
    loop_ = &loop;
    result_.resumed = loop.resumed();
    reports_.emplace(config_, context_, tokenizer_, loop, result_, have_reward_ema_);
  }

  bool draw_companion(int64_t epoch, int64_t batch_index) override {
    if (!mixture()) return true;
    if (batch_index == 0) {
      unsup_batches_.emplace(*unsup_sampler_, epoch, config_.per_device_generation_batch_size, false,
                             [this](const std::vector<int64_t>& items) {
                               return data::collate_sft(unsup_, items, {pad_, std::nullopt}).pinned_for(device());
                             });
    }
    unsup_batch_ = unsup_batches_->next();
    return unsup_batch_.has_value();
  }

  Collected collect(const data::PromptBatch& batch, const PolicyBatch& at) override;
  std::optional<monitor::StepFigures> train(const PolicyStep& step) override;
  void read_reports() override { reports_->read(); }
  void drop_collected() override {
    exp_buffer_.clear();
    unsup_buffer_.clear();
    last_experience_.reset();
  }
  void save_outputs(int64_t steps) override;

 private:
  bool mixture() const { return unsup_sampler_.has_value(); }
  // Actor and critic steps skipped for non-finite gradients so far (engines without loss scaling).
  int64_t engine_skips() {
    int64_t skips = 0;
    for (engine::TrainingEngine* e : engines()) {
      if (!e->uses_loss_scaling()) skips += e->skipped_steps();
    }
    return skips;
  }
  // The guardian's look at the weights after a step (read with the step's report).
  torch::Tensor weight_check() {
    if (!loop_->guard().checks_weights()) return {};
    return models_.actor->training_engine().non_finite_weight_count() +
           models_.critic_engine->non_finite_weight_count().to(device());
  }

  const PpoConfig& config_;
  const StepContext& context_;
  const tokenizer::Tokenizer& tokenizer_;
  RlhfModels& models_;
  const data::TokenizedDataset& unsup_;
  MemoryPhase& memory_;
  const int64_t pad_, eos_;
  const core::SteadyClock::time_point start_ = Clock::now();
  std::optional<data::DistributedSampler> unsup_sampler_;
  std::optional<data::EpochBatches<data::SftBatch>> unsup_batches_;
  std::optional<data::SftBatch> unsup_batch_;  // the current prompt batch's companion
  PolicyLoop* loop_ = nullptr;
  PpoResult result_;
  bool have_reward_ema_ = false;
  std::optional<PpoStepReports> reports_;
  std::optional<Experience> last_experience_;
  std::vector<Experience> exp_buffer_;        // the step's experience so far
  std::vector<data::SftBatch> unsup_buffer_;  // and its mixture batches, on the device
};

Collected PpoAlgorithm::collect(const data::PromptBatch& batch, const PolicyBatch& at) {
  memory_.enter("generating and scoring experience (actor generation; actor, reference, critic and reward forwards)",
                MemoryAdvice::kPpoExperience);
  std::optional<Experience> exp =
      make_experience(models_, batch.input_ids, batch.attention_mask,
                      experience_generation_config(config_, eos_, pad_, at.sample_seed), pad_, config_.min_answer_tokens);
  // The batch's own size: an epoch's last batch may hold fewer prompts than gen_bs.
  reports_->collapse().observe_generation(exp ? exp->rows() : 0, batch.input_ids.size(0));
  if (!exp) {
    if (!last_experience_) {  // DS-Chat asserts here; we skip the batch
      ++result_.skipped_batches;
      core::log_warn(loop_->settings().where, ": every answer of batch ", at.index, " was too short (< ",
                     config_.min_answer_tokens, " tokens); skipped");
      return Collected::kSkipped;
    }
    core::log_warn(loop_->settings().where, ": every answer was too short; reusing the previous batch's experience");
    exp = last_experience_;
  }
  last_experience_ = exp;
  const int64_t steps_done = at.step - 1;
  if (config_.print_answers && context_rank(context_) == 0 && steps_done % config_.print_answers_interval == 0) {
    core::HostSync sync("statistics (print_answers, on request)");
    const std::vector<std::string> answers =
        decode_answers(exp->seq.slice(0, 0, std::min<int64_t>(exp->rows(), 4)), config_.max_prompt_seq_len, tokenizer_);
    for (size_t i = 0; i < answers.size(); ++i) core::log_info("--- answer ", i, ": ", answers[i]);
  }
  exp_buffer_.push_back(*exp);
  // Copied now, while the experience is scored; train_unsupervised finds it in place.
  if (unsup_batch_) unsup_buffer_.push_back(unsup_batch_->to(device(), /*non_blocking=*/true));
  return static_cast<int64_t>(exp_buffer_.size()) < config_.generation_batches ? Collected::kCollected
                                                                              : Collected::kStepReady;
}

// generation_batches experiences cut into training micro-batches, ppo_epochs passes over them
// (shuffled between passes), the actor's and critic's steps; the report waits for its read.
std::optional<monitor::StepFigures> PpoAlgorithm::train(const PolicyStep& step) {
  const auto train_start = Clock::now();
  const int64_t skips_before = engine_skips();
  const int64_t train_bs = config_.per_device_training_batch_size;
  double generate_seconds = 0.0;
  int64_t sequences = 0;
  std::vector<Experience> micro;
  for (const Experience& e : exp_buffer_) {
    generate_seconds += e.generate_seconds;
    sequences += e.rows();
    for (int64_t b = 0; b < e.rows(); b += train_bs) micro.push_back(e.slice(b, std::min(e.rows(), b + train_bs)));
  }
  std::vector<data::SftBatch> unsup_micro = unsup_buffer_;
  std::mt19937_64 shuffle_rng(config_.common.seed + static_cast<uint64_t>(step.step - 1));
  PpoStatsQueue& stats = reports_->stats();
  stats.begin_step();
  memory_.enter("training the actor and critic", MemoryAdvice::kPpoTrain);
  for (int64_t ppo_epoch = 0; ppo_epoch < config_.ppo_epochs; ++ppo_epoch) {
    for (size_t i = 0; i < micro.size(); ++i) {
      stats.add(train_rlhf(models_, micro[i], config_.constants, config_.common.compute_fp32_loss, config_.align_overflow));
      if (mixture() && i < unsup_micro.size()) {
        stats.add_unsupervised(train_unsupervised(models_, unsup_micro[i], config_.data.unsup_coef));
      }
      if (models_.has_ema()) update_ema(models_, kEmaBeta);
    }
    std::shuffle(micro.begin(), micro.end(), shuffle_rng);
    std::shuffle(unsup_micro.begin(), unsup_micro.end(), shuffle_rng);
  }
  exp_buffer_.clear();
  unsup_buffer_.clear();
  const double train_seconds = seconds_since(train_start);
  result_.generate_seconds += generate_seconds;
  result_.train_seconds += train_seconds;
  reports_->step_ended(PendingPpoStep{step.epoch, step.step, step.progress_done, generate_seconds, train_seconds,
                                      sequences, last_experience_->seq, last_experience_->prompt_length,
                                      step.first_batch, step.end_batch, engine_skips() - skips_before, weight_check()});
  return std::nullopt;  // checked when the statistics are read
}

void PpoAlgorithm::save_outputs(int64_t steps) {
  result_.steps = steps;
  result_.seconds = seconds_since(start_);
  const double busy = result_.generate_seconds + result_.train_seconds;
  const int64_t sequences = steps * config_.per_device_generation_batch_size * config_.generation_batches *
                            context_world(context_);
  result_.sequences_per_second = busy > 0.0 ? static_cast<double>(sequences) / busy : 0.0;
  save_rl_outputs(models_, tokenizer_, config_.output_dir, result_.to_json(), context_, config_.actor_model_name_or_path,
                  config_.common.save_format);
}

PolicyLoopSettings ppo_loop_settings(const PpoConfig& config) {
  PolicyLoopSettings settings;
  settings.where = "step 3 (PPO)";
  settings.progress_name = "PPO";
  settings.output_dir = config.output_dir;
  settings.common = config.common;
  settings.generation_batch_size = config.per_device_generation_batch_size;
  settings.generation_batches = config.generation_batches;
  settings.prompt_length = config.max_prompt_seq_len;
  settings.steps_span_epochs = true;  // generation_batches may gather a step across an epoch's end
  if (config.enable_test_mode) settings.stop_after_step = config.test_stop_step;
  return settings;
}

PpoResult run_ppo_phases(const PpoConfig& config, const StepContext& context, MemoryPhase& memory) {
  PolicyLoop loop(ppo_loop_settings(config), context);
  const std::string& where = loop.settings().where;
  // Loading copies host tensors in: named, so the sync-debug test checks only the loop.
  std::optional<core::HostSync> setup_sync(std::in_place, "step setup (models, engines, data)");
  torch::manual_seed(config.common.seed);

  auto tokenizer = load_step_tokenizer(context, config.actor_model_name_or_path);
  const int64_t pad = pad_token_of(tokenizer);
  const int64_t P = config.max_prompt_seq_len;
  const data::PhaseData phase = data::create_prompt_dataset(
      prompt_data_options(config.data, 3, config.common.seed, P, eos_text_of(tokenizer)), tokenizer);
  data::TokenizedDataset unsup;
  if (!config.data.unsupervised_dataset_name.empty()) {
    data::UnsupervisedDataOptions options;
    options.paths = config.data.unsupervised_dataset_name;
    options.block_size = P + config.max_answer_seq_len;
    options.cache_dir = config.data.data_output_path;
    unsup = data::create_unsupervised_dataset(options, tokenizer);
  }
  const bool mixture = !config.data.unsupervised_dataset_name.empty();
  const int64_t gen_bs = config.per_device_generation_batch_size;
  int64_t mixture_batches = -1;  // an epoch ends with the shorter of the prompt and mixture data
  std::optional<data::DistributedSampler> unsup_sampler;
  if (mixture) {
    unsup_sampler.emplace(unsup.size(), loop.world(), loop.rank(), /*shuffle=*/true, config.common.seed);
    mixture_batches = (unsup_sampler->num_samples() + gen_bs - 1) / gen_bs;
  }
  loop.set_prompts(phase, pad, mixture_batches);
  const int64_t gas = config.common.gradient_accumulation_steps;
  const int64_t actor_gas = mixture ? 2 * gas : gas;  // DS-Chat doubles it: two actor backwards per micro-step
  const int64_t total_iters = static_cast<int64_t>(
      static_cast<double>(config.common.num_train_epochs * loop.steps_per_epoch()) *
      (static_cast<double>(gen_bs) / static_cast<double>(config.per_device_training_batch_size)) *
      static_cast<double>(config.ppo_epochs) / static_cast<double>(gas));
  RlhfModels models = build_rlhf_models(config, total_iters, actor_gas, context);
  check_vocab(models.actor->actor()->config().vocab_size, tokenizer, config.actor_model_name_or_path);
  check_sequence_length(models.actor->actor()->config(), config.max_prompt_seq_len + config.max_answer_seq_len,
                        where + ": keys 'max_prompt_seq_len' + 'max_answer_seq_len'", config.actor_model_name_or_path);
  PpoAlgorithm algorithm(config, context, tokenizer, models, unsup, std::move(unsup_sampler), memory);
  setup_sync.reset();
  loop.run(algorithm);
  return algorithm.result();
}

}  // namespace

PpoResult run_ppo(const PpoConfig& config, const StepContext& context) {
  MemoryPhase memory{"step 3 (PPO)", "actor " + config.actor_model_name_or_path + ", critic " +
                                         config.critic_model_name_or_path,
                     "loading the actor, reference, critic and reward models"};
  return with_memory_hint(memory, [&] { return run_ppo_phases(config, context, memory); });
}

}  // namespace rlhf
}  // namespace dschat
