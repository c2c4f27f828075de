#include "dschat/core/host_sync.h"
#include "dschat/rlhf/trainers/reward_trainer.h"

#include "core/stopwatch.h"
#include "core/log.h"
#include "dschat/data/collate.h"
#include "dschat/data/epoch_batches.h"
#include "dschat/models/load_save.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/rlhf/math/reward_loss.h"
#include "dschat/rlhf/setup/rlhf_models.h"
#include "rlhf/setup/memory_hint.h"
#include "dschat/rlhf/setup/step_runner.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "dschat/rlhf/loop/supervised_loop.h"
#include "rlhf/loop/supervised_step.h"

namespace dschat {
namespace rlhf {
namespace {

using Clock = core::SteadyClock;
using core::seconds_since;

nlohmann::json evaluation_json(const RewardEvaluation& e) {
  return {{"accuracy", e.accuracy}, {"chosen_score", e.chosen_score}, {"rejected_score", e.rejected_score}};
}

void log_evaluation(const RewardEvaluation& e) {
  core::log_info("chosen_last_scores (higher is better) : ", e.chosen_score,
                 ", rejected_last_scores (lower is better) : ", e.rejected_score, ", acc (higher is better) : ",
                 e.accuracy);
}

}  // namespace

nlohmann::json RewardResult::to_json() const {
  return {{"before", evaluation_json(before)},
          {"after", evaluation_json(after)},
          {"mean_train_loss", mean_train_loss},
          {"optimizer_steps", optimizer_steps},
          {"num_padding_at_beginning", num_padding_at_beginning},
          {"seconds", seconds}};
}

RewardEvaluation evaluate_reward_model(models::ValueHeadModel& model, const data::TokenizedDataset& pairs,
                                       int64_t batch_size, int64_t max_batches, int64_t pad_token_id,
                                       int64_t num_padding_at_beginning, const StepContext& context) {
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  data::DistributedSampler sampler(pairs.size(), context_world(context), context_rank(context), /*shuffle=*/false);
  const torch::Device device = parameter_device(*model);
  data::EpochBatches<data::RewardBatch> batches(sampler, 0, batch_size, false, [&](const std::vector<int64_t>& items) {
    return data::collate_reward(pairs, items, {pad_token_id, std::nullopt}).pinned_for(device);
  });
  RewardEvaluation result;
  // Per batch: pairs won, mean chosen and mean rejected end score, each [] on the device; read
  // once after the loop and summed on the host in batch order (as a read per batch would be).
  std::vector<torch::Tensor> batch_figures;
  int64_t batch_count = 0;
  while (auto host_batch = batches.next()) {
    if (max_batches > 0 && batch_count >= max_batches) break;
    const data::RewardBatch batch = host_batch->to(device, /*non_blocking=*/true);
    // Right padded, and only real tokens' end scores are read: SDPA's causal path is exact. (The
    // training loss also averages over the shorter answer's pad positions: it keeps the mask.)
    torch::Tensor values = model->forward(batch.input_ids, batch.attention_mask, nn::MaskLayout::kRightPadded);  // [2B, T]
    // The host ids: the pair indices are read from them, not from the device.
    RewardLossOutput out = reward_pairwise_loss(host_batch->input_ids, values.to(torch::kFloat32), pad_token_id,
                                                num_padding_at_beginning);
    batch_figures.push_back((out.chosen_end_scores > out.rejected_end_scores).sum());
    batch_figures.push_back(out.chosen_end_scores.mean());
    batch_figures.push_back(out.rejected_end_scores.mean());
    result.pairs += out.chosen_end_scores.size(0);
    ++batch_count;
  }
  if (was_training) model->train();
  const std::vector<double> figures = read_to_host(batch_figures);
  double correct = 0.0, chosen_sum = 0.0, rejected_sum = 0.0;
  for (size_t i = 0; i < figures.size(); i += 3) {
    correct += figures[i];
    chosen_sum += figures[i + 1];
    rejected_sum += figures[i + 2];
  }
  const double batches_d = std::max<double>(static_cast<double>(batch_count), 1.0);
  result.accuracy = all_reduce_mean(context, result.pairs > 0 ? correct / static_cast<double>(result.pairs) : 0.0);
  result.chosen_score = all_reduce_mean(context, chosen_sum / batches_d);
  result.rejected_score = all_reduce_mean(context, rejected_sum / batches_d);
  return result;
}

RewardEvaluation evaluate_reward_model_on_data(const std::string& model_dir, const DataConfig& data,
                                               int64_t max_seq_len, int64_t batch_size,
                                               std::optional<int64_t> num_padding_at_beginning,
                                               const StepContext& context, const torch::Device& device) {
  auto tokenizer = load_step_tokenizer(context, model_dir);
  models::LoadOptions load;
  load.device = device;
  models::ValueHeadModel model = models::load_value_model(model_dir, load);
  check_vocab(model->config().vocab_size, tokenizer, model_dir);
  data::PhaseData phase = data::create_prompt_dataset(
      prompt_data_options(data, 2, 1234, max_seq_len, eos_text_of(tokenizer)), tokenizer);
  DSCHAT_CHECK(phase.eval.size() > 0, InvalidArgument, model_dir, ": the data's phase-2 eval split is empty");
  RewardEvaluation result =
      evaluate_reward_model(model, phase.eval, batch_size, 0, pad_token_of(tokenizer),
                            num_padding_at_beginning.value_or(padding_at_beginning(tokenizer)), context);
  result.pairs = phase.eval.size();
  return result;
}

namespace {

// What the reward model's hooks use of the step's setup.
struct RewardModelStep {
  models::ValueHeadModel& model;
  engine::TrainingEngine& engine;
  SupervisedData& data;
  monitor::MetricsLog& metrics;
  int64_t pad, npb;  // pad token; num_padding_at_beginning
};

// Accuracy and scores before training, every eval_interval steps and after each epoch; the
// epoch's mean loss; the step reports.
void add_reward_reports(SupervisedLoop<data::RewardBatch>& loop, const RewardConfig& config, const StepContext& context,
                        RewardModelStep& m, RewardResult& result, MemoryPhase& memory) {
  loop.evaluate = [&](const EvaluationRequest& at) {
    log_evaluation_banner("reward", at, config.common.num_train_epochs);
    memory.enter("evaluating accuracy", MemoryAdvice::kEvaluate);
    const RewardEvaluation e = evaluate_reward_model(m.model, m.data.phase.eval, config.per_device_eval_batch_size,
                                                     config.eval_iters, m.pad, m.npb, context);
    memory.enter("training", MemoryAdvice::kTrain);
    m.engine.release_gathered_parameters();
    log_evaluation(e);
    m.metrics.write("rm", at.step, {{"eval_acc", e.accuracy}, {"eval_chosen", e.chosen_score},
                                    {"eval_rejected", e.rejected_score}});
    if (at.point != EvaluationPoint::kInterval) {
      (at.point == EvaluationPoint::kBeforeTraining ? result.before : result.after) = e;
      return;
    }
    core::log_info("Iter ", at.step, ": c_scores: ", e.chosen_score, ", r_scores: ", e.rejected_score,
                   ", diff: ", e.chosen_score - e.rejected_score, ", acc: ", e.accuracy);
  };
  loop.on_epoch_end = [&](const EpochDone& done) {
    result.mean_train_loss = log_epoch_loss(done, config.common.num_train_epochs, context);
  };
  loop.on_optimizer_step = [&](const OptimizerStepDone& done, const data::RewardBatch& batch) {
    m.metrics.write("rm", done.step, {{"loss", all_reduce_mean(context, done.window_loss)},
                                      {"lr", done.learning_rates.front()}});
    // A pair is two rows: chosen and rejected.
    log_step_throughput(done, 2 * m.data.micro * m.data.gas, batch.input_ids.size(1), m.model->config(),
                        config.model, config.common, context);
    return "loss " + std::to_string(done.window_loss);
  };
}

RewardResult run_reward_phases(const RewardConfig& config, const StepContext& context, MemoryPhase& memory) {
  const std::string where = "step 2 (reward model)";
  StepOpening open(where, config.output_dir, config.common, context, config.model_name_or_path);
  const int64_t pad = pad_token_of(open.tokenizer);
  RewardResult result;
  result.num_padding_at_beginning = config.num_padding_at_beginning.value_or(padding_at_beginning(open.tokenizer));
  const int64_t npb = result.num_padding_at_beginning;

  const torch::Device device = step_device(config.common, context, where);
  models::LoadOptions load = step_load_options(config.common, config.model, context, device);
  std::shared_ptr<models::DeferredParameters> deferred = defer_load_at_stage3(load, config.model.zero_stage);
  models::ValueHeadModel model = models::load_value_model(config.model_name_or_path, load,
                                                             /*allow_missing_head=*/true);
  prepare_trained_model(model, config.model, config.common, open.tokenizer, config.model_name_or_path,
                        config.max_seq_len, where, {"v_head.weight"});
  SupervisedData data = load_supervised_data(config.data, 2, config.common, config.max_seq_len,
                                             eos_text_of(open.tokenizer), config.per_device_train_batch_size,
                                             open.tokenizer, context);
  std::unique_ptr<engine::TrainingEngine> engine = make_training_engine(
      model.ptr(), config.common, config.model, data.micro, data.total_steps, context, where, std::move(deferred));
  monitor::MetricsLog metrics(open.runner.log_dir(), metrics_log_options(config.common, context));
  RewardModelStep m{model, *engine, data, metrics, pad, npb};

  SupervisedLoop<data::RewardBatch> loop;
  use_supervised_step(loop, config.common, context, metrics, "reward model", data.total_steps, config.eval_interval);
  loop.on_resume = [&](const ResumePoint& at) {
    const nlohmann::json& before = at.client_state.at("before");
    result.before.accuracy = before.at("accuracy").get<double>();
    result.before.chosen_score = before.at("chosen_score").get<double>();
    result.before.rejected_score = before.at("rejected_score").get<double>();
    result.resumed = true;
    log_resume(where, open.runner, at);
  };
  loop.client_state = [&] { return nlohmann::json{{"before", evaluation_json(result.before)}}; };
  add_reward_reports(loop, config, context, m, result, memory);
  loop.epoch_batches = [&](int64_t epoch) {
    return data::EpochBatches<data::RewardBatch>(data.sampler, epoch, data.micro, false,
                                                 [&](const std::vector<int64_t>& items) {
                                                   return data::collate_reward(data.phase.train, items, {pad, std::nullopt})
                                                       .pinned_for(device);
                                                 });
  };
  loop.train_micro_batch = [&](const data::RewardBatch& host_batch) {
    const data::RewardBatch batch = host_batch.to(device, /*non_blocking=*/true);
    torch::Tensor values = model->forward(batch.input_ids, batch.attention_mask);  // [2B, T]
    // The pair indices come from the host ids: no wait for the device in the loss.
    return reward_pairwise_loss(host_batch.input_ids, values, pad, npb, config.common.compute_fp32_loss).loss;  // []
  };
  loop.save_model = final_save(result, open, *engine, model->config(), config.output_dir, context, /*announce=*/false);
  run_supervised_step(loop, open, *engine);
  return result;
}

}  // namespace

RewardResult run_reward(const RewardConfig& config, const StepContext& context) {
  MemoryPhase memory{"step 2 (reward model)", config.model_name_or_path};
  return with_memory_hint(memory, [&] { return run_reward_phases(config, context, memory); });
}

}  // namespace rlhf
}  // namespace dschat
