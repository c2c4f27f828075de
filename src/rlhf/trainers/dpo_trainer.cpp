#include "dschat/core/host_sync.h"
#include "dschat/rlhf/trainers/dpo_trainer.h"

#include "core/log.h"
#include "core/stopwatch.h"
#include "dschat/data/collate.h"
#include "dschat/data/epoch_batches.h"
#include "dschat/models/load_save.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/rlhf/math/dpo_loss.h"
#include "dschat/rlhf/setup/rlhf_models.h"
#include "dschat/rlhf/setup/step_runner.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "dschat/rlhf/loop/supervised_loop.h"
#include "rlhf/loop/supervised_step.h"
#include "rlhf/setup/memory_hint.h"

namespace dschat {
namespace rlhf {
namespace {

using Clock = core::SteadyClock;
using core::seconds_since;
constexpr const char* kDpoStep = "step 2 (DPO)";

nlohmann::json evaluation_json(const DpoEvaluation& e) {
  return {{"loss", e.loss}, {"chosen_reward", e.chosen_reward}, {"rejected_reward", e.rejected_reward},
          {"margin", e.margin()}, {"accuracy", e.accuracy}};
}

DpoEvaluation evaluation_from_json(const nlohmann::json& j) {
  DpoEvaluation e;
  e.loss = j.at("loss").get<double>();
  e.chosen_reward = j.at("chosen_reward").get<double>();
  e.rejected_reward = j.at("rejected_reward").get<double>();
  e.accuracy = j.at("accuracy").get<double>();
  return e;
}

// The policy and its frozen reference, and what a batch of pairs costs them.
struct DpoModels {
  models::CausalLM policy{nullptr};
  models::CausalLM reference{nullptr};
  std::unique_ptr<engine::ZeroInferenceEngine> reference_engine;  // the policy trains at stage 3
  torch::Device device = torch::kCPU;            // the policy's
  torch::Device reference_device = torch::kCPU;  // the CPU with offload_reference_model below stage 3
  const DpoConfig* config = nullptr;
  int64_t pad = 0;

  // [2B] reference log-probs of `ids` under `label_mask` (both [2B, T] on `device`), no graph.
  torch::Tensor reference_log_probs(const data::RewardBatch& batch, const torch::Tensor& label_mask) {
    torch::NoGradGuard no_grad;
    const bool moved = reference_device != device;
    const torch::Tensor ids = moved ? batch.input_ids.to(reference_device) : batch.input_ids;  // [2B, T]
    const torch::Tensor mask = moved ? batch.attention_mask.to(reference_device) : batch.attention_mask;
    torch::Tensor logits = reference->forward(ids, mask, nn::MaskLayout::kRightPadded);  // [2B, T, V]
    if (config->common.compute_fp32_loss) logits = logits.to(torch::kFloat32);
    torch::Tensor logps =
        dpo_sequence_log_probs(logits, ids, moved ? label_mask.to(reference_device) : label_mask);  // [2B]
    if (reference_engine) reference_engine->release_gathered_parameters();
    return moved ? logps.to(device) : logps;
  }

  // The loss of one batch (on `device`), with the policy's graph unless under NoGradGuard.
  DpoLossOutput loss(const data::RewardBatch& batch) {
    const torch::Tensor label_mask = dpo_label_mask(batch.input_ids, pad);  // [2B, T]
    torch::Tensor logits = policy->forward(batch.input_ids, batch.attention_mask, nn::MaskLayout::kRightPadded);
    if (config->common.compute_fp32_loss) logits = logits.to(torch::kFloat32);  // [2B, T, V]
    const torch::Tensor logps = dpo_sequence_log_probs(logits, batch.input_ids, label_mask);  // [2B]
    return dpo_loss(logps, reference_log_probs(batch, label_mask), config->beta, config->label_smoothing);
  }
};

// Mean loss, rewards and accuracy over (at most eval_iters) batches of this rank's eval pairs,
// read once at the end, then all-reduced over the ranks.
DpoEvaluation evaluate_dpo(DpoModels& models, const data::TokenizedDataset& pairs, const StepContext& context) {
  const DpoConfig& config = *models.config;
  const bool was_training = models.policy->is_training();
  models.policy->eval();
  torch::NoGradGuard no_grad;
  data::DistributedSampler sampler(pairs.size(), context_world(context), context_rank(context), /*shuffle=*/false);
  data::EpochBatches<data::RewardBatch> batches(
      sampler, 0, config.per_device_eval_batch_size, false, [&](const std::vector<int64_t>& items) {
        return data::collate_reward(pairs, items, {models.pad, std::nullopt}).pinned_for(models.device);
      });
  std::vector<torch::Tensor> sums;  // per batch: loss, Σ chosen reward, Σ rejected reward, pairs won
  int64_t count = 0;
  double n = 0.0;  // pairs evaluated
  while (auto host_batch = batches.next()) {
    if (count++ >= config.eval_iters) break;
    const DpoLossOutput out = models.loss(host_batch->to(models.device, /*non_blocking=*/true));
    sums.push_back(out.loss);
    sums.push_back(out.chosen_rewards.sum());
    sums.push_back(out.rejected_rewards.sum());
    sums.push_back((out.chosen_rewards > out.rejected_rewards).sum());
    n += static_cast<double>(host_batch->input_ids.size(0) / 2);
  }
  if (was_training) models.policy->train();
  const std::vector<double> figures = read_to_host(sums);
  double loss = 0.0, chosen = 0.0, rejected = 0.0, won = 0.0;
  for (size_t i = 0; i < figures.size(); i += 4) {
    loss += figures[i];
    chosen += figures[i + 1];
    rejected += figures[i + 2];
    won += figures[i + 3];
  }
  const double batches_done = static_cast<double>(figures.size() / 4);
  DpoEvaluation e;
  e.loss = all_reduce_mean(context, batches_done > 0 ? loss / batches_done : 0.0);
  e.chosen_reward = all_reduce_mean(context, n > 0 ? chosen / n : 0.0);
  e.rejected_reward = all_reduce_mean(context, n > 0 ? rejected / n : 0.0);
  e.accuracy = all_reduce_mean(context, n > 0 ? won / n : 0.0);
  return e;
}

// The policy and its frozen reference (DS-Chat's reference: get_eval_ds_config with
// offload_reference_model, stage 3 if the policy's is, else 0), both from the SFT model, with the
// same weights when initialised at random; `deferred`: the policy's ZeRO-3 partitioned load.
void load_dpo_models(DpoModels& models, const DpoConfig& config, const StepContext& context,
                     const tokenizer::Tokenizer& tokenizer, std::shared_ptr<models::DeferredParameters>& deferred) {
  models.config = &config;
  models.pad = pad_token_of(tokenizer);
  models.device = step_device(config.common, context, kDpoStep);
  models::LoadOptions load = step_load_options(config.common, config.model, context, models.device);
  const bool zero3 = config.model.zero_stage == 3;
  const ModelPlacement reference_at =
      zero3 ? ModelPlacement{models.device, load.dtype, true, config.offload_reference_model}
      : config.offload_reference_model ? ModelPlacement{torch::kCPU, load.dtype}
                                       : ModelPlacement{models.device, load.dtype};
  models.reference_device = reference_at.device;
  torch::manual_seed(config.common.seed);
  models.reference =
      load_frozen_causal_lm(config.model_name_or_path, reference_at, load, context, models.reference_engine);
  torch::manual_seed(config.common.seed);  // a random init gives the policy the reference's weights
  deferred = defer_load_at_stage3(load, config.model.zero_stage);
  models.policy = models::load_causal_lm(config.model_name_or_path, load);
  prepare_trained_model(models.policy, config.model, config.common, tokenizer, config.model_name_or_path,
                        config.max_seq_len, kDpoStep);
}

// The implicit rewards before training, every eval_interval steps and after each epoch; the
// epoch's mean loss; the step reports.
void add_dpo_reports(SupervisedLoop<data::RewardBatch>& loop, const DpoConfig& config, const StepContext& context,
                     DpoModels& models, engine::TrainingEngine& engine, const SupervisedData& data,
                     monitor::MetricsLog& metrics, DpoResult& result, MemoryPhase& memory) {
  loop.evaluate = [&](const EvaluationRequest& at) {
    log_evaluation_banner("rewards", at, config.common.num_train_epochs);
    memory.enter("evaluating the implicit rewards", MemoryAdvice::kEvaluate);
    const DpoEvaluation e = evaluate_dpo(models, data.phase.eval, context);
    memory.enter("training", MemoryAdvice::kTrain);
    engine.release_gathered_parameters();
    core::log_info("chosen: ", e.chosen_reward, ", rejected: ", e.rejected_reward, ", margin: ", e.margin(),
                   ", acc: ", e.accuracy, ", loss: ", e.loss);
    metrics.write("dpo", at.step, {{"eval_loss", e.loss}, {"eval_chosen_reward", e.chosen_reward},
                                   {"eval_rejected_reward", e.rejected_reward}, {"eval_margin", e.margin()},
                                   {"eval_acc", e.accuracy}});
    if (at.point == EvaluationPoint::kInterval) return;
    (at.point == EvaluationPoint::kBeforeTraining ? result.before : result.after) = e;
  };
  loop.on_epoch_end = [&](const EpochDone& done) {
    result.mean_train_loss = log_epoch_loss(done, config.common.num_train_epochs, context);
  };
  loop.on_optimizer_step = [&](const OptimizerStepDone& done, const data::RewardBatch& batch) {
    const double mean_loss = all_reduce_mean(context, done.window_loss);
    metrics.write("dpo", done.step, {{"loss", mean_loss}, {"lr", done.learning_rates.front()}});
    // A pair is two rows: chosen and rejected.
    log_step_throughput(done, 2 * data.micro * data.gas, batch.input_ids.size(1), models.policy->config(),
                        config.model, config.common, context);
    return "loss " + std::to_string(mean_loss);
  };
}

DpoResult run_dpo_phases(const DpoConfig& config, const StepContext& context, MemoryPhase& memory) {
  StepOpening open(kDpoStep, config.output_dir, config.common, context, config.model_name_or_path);
  DpoModels models;
  std::shared_ptr<models::DeferredParameters> deferred;
  load_dpo_models(models, config, context, open.tokenizer, deferred);
  SupervisedData data = load_supervised_data(config.data, 2, config.common, config.max_seq_len,
                                             eos_text_of(open.tokenizer), config.per_device_train_batch_size,
                                             open.tokenizer, context);
  std::unique_ptr<engine::TrainingEngine> engine =
      make_training_engine(models.policy.ptr(), config.common, config.model, data.micro, data.total_steps, context,
                           kDpoStep, std::move(deferred));
  monitor::MetricsLog metrics(open.runner.log_dir(), metrics_log_options(config.common, context));
  memory.enter("training", MemoryAdvice::kTrain);

  DpoResult result;
  SupervisedLoop<data::RewardBatch> loop;
  use_supervised_step(loop, config.common, context, metrics, "DPO", data.total_steps, config.eval_interval);
  loop.on_resume = [&](const ResumePoint& at) {
    result.before = evaluation_from_json(at.client_state.at("before"));
    result.resumed = true;
    log_resume(kDpoStep, open.runner, at);
  };
  loop.client_state = [&] { return nlohmann::json{{"before", evaluation_json(result.before)}}; };
  add_dpo_reports(loop, config, context, models, *engine, data, metrics, result, memory);
  loop.epoch_batches = [&](int64_t epoch) {
    return data::EpochBatches<data::RewardBatch>(data.sampler, epoch, data.micro, false,
                                                 [&](const std::vector<int64_t>& items) {
                                                   return data::collate_reward(data.phase.train, items,
                                                                               {models.pad, std::nullopt})
                                                       .pinned_for(models.device);
                                                 });
  };
  loop.train_micro_batch = [&](const data::RewardBatch& host_batch) {
    return models.loss(host_batch.to(models.device, /*non_blocking=*/true)).loss;  // []
  };
  loop.save_model =
      final_save(result, open, *engine, models.policy->config(), config.output_dir, context, /*announce=*/true);
  run_supervised_step(loop, open, *engine);
  return result;
}

}  // namespace

nlohmann::json DpoResult::to_json() const {
  return {{"before", evaluation_json(before)}, {"after", evaluation_json(after)}, {"mean_train_loss", mean_train_loss},
          {"optimizer_steps", optimizer_steps}, {"seconds", seconds}};
}

DpoResult run_dpo(const DpoConfig& config, const StepContext& context) {
  MemoryPhase memory{kDpoStep, config.model_name_or_path};
  return with_memory_hint(memory, [&] { return run_dpo_phases(config, context, memory); });
}

}  // namespace rlhf
}  // namespace dschat
