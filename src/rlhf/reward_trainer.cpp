#include "dschat/rlhf/reward_trainer.h"

#include <chrono>

#include "core/log.h"
#include "dschat/data/collate.h"
#include "dschat/data/epoch_batches.h"
#include "dschat/inference/model_loader.h"
#include "dschat/rlhf/metrics_log.h"
#include "dschat/rlhf/progress.h"
#include "dschat/rlhf/reward_loss.h"
#include "rlhf/memory_hint.h"
#include "rlhf/step_runner.h"
#include "rlhf/step_setup.h"
#include "rlhf/throughput.h"

namespace dschat {
namespace rlhf {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

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
  data::EpochBatches<data::RewardBatch> batches(sampler, 0, batch_size, false, [&](const std::vector<int64_t>& items) {
    return data::collate_reward(pairs, items, {pad_token_id, std::nullopt});
  });
  RewardEvaluation result;
  double correct = 0.0, chosen_sum = 0.0, rejected_sum = 0.0;
  int64_t batch_count = 0;
  while (auto batch = batches.next()) {
    if (max_batches > 0 && batch_count >= max_batches) break;
    torch::Tensor values = model->forward(batch->input_ids, batch->attention_mask);  // [2B, T]
    RewardLossOutput out = reward_pairwise_loss(batch->input_ids, values.to(torch::kFloat32), pad_token_id,
                                                num_padding_at_beginning);
    correct += (out.chosen_end_scores > out.rejected_end_scores).sum().item<double>();
    chosen_sum += out.chosen_end_scores.mean().item<double>();
    rejected_sum += out.rejected_end_scores.mean().item<double>();
    result.pairs += out.chosen_end_scores.size(0);
    ++batch_count;
  }
  if (was_training) model->train();
  const double batches_d = std::max<double>(static_cast<double>(batch_count), 1.0);
  result.accuracy = all_reduce_mean(context, result.pairs > 0 ? correct / static_cast<double>(result.pairs) : 0.0);
  result.chosen_score = all_reduce_mean(context, chosen_sum / batches_d);
  result.rejected_score = all_reduce_mean(context, rejected_sum / batches_d);
  return result;
}

RewardEvaluation evaluate_reward_model_on_data(const std::string& model_dir, const DataConfig& data,
                                               int64_t max_seq_len, int64_t batch_size,
                                               std::optional<int64_t> num_padding_at_beginning,
                                               const StepContext& context) {
  auto tokenizer = load_step_tokenizer(context, model_dir);
  models::ValueHeadModel model = inference::load_value_model(model_dir, {});
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

RewardResult run_reward_phases(const RewardConfig& config, const StepContext& context, MemoryPhase& memory) {
  const auto start = Clock::now();
  const std::string where = "step 2 (reward model)";
  const int64_t rank = context_rank(context), world = context_world(context);
  StepRunner runner(where, config.output_dir, config.common, context);
  torch::manual_seed(config.common.seed);

  auto tokenizer = load_step_tokenizer(context, config.model_name_or_path);
  const int64_t pad = pad_token_of(tokenizer);
  RewardResult result;
  result.num_padding_at_beginning = config.num_padding_at_beginning.value_or(padding_at_beginning(tokenizer));
  const int64_t npb = result.num_padding_at_beginning;

  inference::LoadOptions load;
  load.dtype = step_dtype(config.common.dtype, where);
  load.random_init = context.random_init;
  load.dropout = config.model.dropout;
  models::ValueHeadModel model = inference::load_value_model(config.model_name_or_path, load,
                                                             /*allow_missing_head=*/true);
  check_vocab(model->config().vocab_size, tokenizer, config.model_name_or_path);
  model->backbone().set_gradient_checkpointing(config.model.gradient_checkpointing);
  apply_lora(*model, config.model, config.common.only_optimize_lora, {"v_head.weight"});
  model->train();

  data::PhaseData phase = data::create_prompt_dataset(
      prompt_data_options(config.data, 2, config.common.seed, config.max_seq_len, eos_text_of(tokenizer)), tokenizer);
  data::DistributedSampler sampler(phase.train.size(), world, rank, /*shuffle=*/true, config.common.seed);
  const int64_t micro = config.per_device_train_batch_size;
  const int64_t gas = config.common.gradient_accumulation_steps;
  const int64_t batches_per_epoch = (sampler.num_samples() + micro - 1) / micro;
  const int64_t total_steps = optimizer_steps_for(config.common.num_train_epochs, batches_per_epoch, gas);
  std::unique_ptr<engine::TrainingEngine> engine_owner =
      make_training_engine(model.ptr(), config.common, config.model, micro, total_steps, context, where);
  engine::TrainingEngine& engine = *engine_owner;
  MetricsLog metrics(runner.log_dir(), metrics_log_options(config.common, context));
  auto evaluate = [&](int64_t step) {
    memory.enter("evaluating accuracy", MemoryAdvice::kEvaluate);
    RewardEvaluation e = evaluate_reward_model(model, phase.eval, config.per_device_eval_batch_size,
                                               config.eval_iters, pad, npb, context);
    memory.enter("training", MemoryAdvice::kTrain);
    engine.release_gathered_parameters();
    log_evaluation(e);
    metrics.write("rm", step, {{"eval_acc", e.accuracy}, {"eval_chosen", e.chosen_score},
                               {"eval_rejected", e.rejected_score}});
    return e;
  };

  int64_t start_epoch = 0, skip_batches = 0;
  if (runner.can_resume()) {
    const nlohmann::json state = engine.load_checkpoint(runner.checkpoint_dir());
    start_epoch = state.at("epoch").get<int64_t>();
    skip_batches = state.at("batch").get<int64_t>();
    const nlohmann::json& before = state.at("before");
    result.before.accuracy = before.at("accuracy").get<double>();
    result.before.chosen_score = before.at("chosen_score").get<double>();
    result.before.rejected_score = before.at("rejected_score").get<double>();
    result.resumed = true;
    core::log_info(where, ": resuming from ", runner.checkpoint_dir().string(), " at epoch ", start_epoch,
                   ", micro-batch ", skip_batches);
  } else {
    core::log_info("***** Evaluating reward, Epoch 0/", config.common.num_train_epochs, " *****");
    result.before = evaluate(0);
  }
  auto client_state = [&](int64_t epoch, int64_t batch) {
    return nlohmann::json{{"epoch", epoch}, {"batch", batch}, {"before", evaluation_json(result.before)}};
  };

  Progress progress("reward model", total_steps, config.common.print_interval, !context.progress);
  for (int64_t epoch = start_epoch; epoch < config.common.num_train_epochs; ++epoch) {
    core::log_info("Beginning of Epoch ", epoch + 1, "/", config.common.num_train_epochs,
                   ", Total Micro Batches ", batches_per_epoch);
    data::EpochBatches<data::RewardBatch> batches(sampler, epoch, micro, false, [&](const std::vector<int64_t>& items) {
      return data::collate_reward(phase.train, items, {pad, std::nullopt});
    });
    int64_t batch_index = 0, loss_count = 0;
    double loss_sum = 0.0, window_loss = 0.0;
    auto step_start = Clock::now();
    while (auto batch = batches.next()) {
      if (batch_index++ < skip_batches) continue;
      torch::Tensor values = model->forward(batch->input_ids, batch->attention_mask);  // [2B, T]
      RewardLossOutput out = reward_pairwise_loss(batch->input_ids, values, pad, npb, config.common.compute_fp32_loss);
      engine.backward(out.loss);
      const double loss = out.loss.item<double>();
      loss_sum += loss;
      ++loss_count;
      window_loss += loss / static_cast<double>(gas);
      const bool boundary = engine.is_gradient_accumulation_boundary();
      engine.step();
      if (!boundary) continue;
      const int64_t step = engine.global_steps();
      const double step_seconds = seconds_since(step_start);
      metrics.write("rm", step, {{"loss", all_reduce_mean(context, window_loss)},
                                 {"lr", engine.learning_rates().front()}});
      if (rank == 0 && config.common.print_interval > 0 && step % config.common.print_interval == 0) {
        core::log_info(training_throughput_line(model->config(), 2 * micro * gas, batch->input_ids.size(1),
                                                step_seconds, config.model.gradient_checkpointing,
                                                config.model.lora_dim, world));
      }
      progress.update(step, "loss " + std::to_string(window_loss));
      window_loss = 0.0;
      if (config.eval_interval > 0 && step % config.eval_interval == 0) {
        RewardEvaluation e = evaluate(step);
        core::log_info("Iter ", step, ": c_scores: ", e.chosen_score, ", r_scores: ", e.rejected_score,
                       ", diff: ", e.chosen_score - e.rejected_score, ", acc: ", e.accuracy);
      }
      runner.after_optimizer_step(step, [&] {
        engine.save_checkpoint(runner.checkpoint_dir(), "", client_state(epoch, batch_index));
      });
      step_start = Clock::now();
    }
    skip_batches = 0;
    result.mean_train_loss = all_reduce_mean(context, loss_count > 0 ? loss_sum / static_cast<double>(loss_count) : 0.0);
    core::log_info("Epoch ", epoch + 1, "/", config.common.num_train_epochs, " with loss ", result.mean_train_loss);
    core::log_info("***** Evaluating reward, Epoch ", epoch + 1, "/", config.common.num_train_epochs, " *****");
    result.after = evaluate(engine.global_steps());
    if (engine.is_gradient_accumulation_boundary()) {
      engine.save_checkpoint(runner.checkpoint_dir(), "", client_state(epoch + 1, 0));
    }
  }
  progress.finish();
  if (start_epoch >= config.common.num_train_epochs) result.after = evaluate(engine.global_steps());  // resumed at the end
  result.optimizer_steps = engine.global_steps();
  result.seconds = seconds_since(start);
  save_trained_model(engine, model->config(), tokenizer, config.output_dir, result.to_json(), context);
  runner.finish();
  return result;
}

}  // namespace

RewardResult run_reward(const RewardConfig& config, const StepContext& context) {
  MemoryPhase memory{"step 2 (reward model)", config.model_name_or_path};
  return with_memory_hint(memory, [&] { return run_reward_phases(config, context, memory); });
}

}  // namespace rlhf
}  // namespace dschat
