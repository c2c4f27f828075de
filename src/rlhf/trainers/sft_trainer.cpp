#include "dschat/core/host_sync.h"
#include "dschat/rlhf/trainers/sft_trainer.h"

#include "core/stopwatch.h"
#include "core/log.h"
#include "dschat/data/collate.h"
#include "dschat/data/epoch_batches.h"
#include "dschat/models/load_save.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/rlhf/math/sft_loss.h"
#include "rlhf/setup/memory_hint.h"
#include "dschat/rlhf/setup/step_runner.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "dschat/rlhf/loop/supervised_loop.h"
#include "rlhf/loop/supervised_step.h"

namespace dschat {
namespace rlhf {
namespace {

// Names the step in messages and in out-of-memory errors.
constexpr char kSftStep[] = "step 1 (SFT)";

using Clock = core::SteadyClock;
using core::seconds_since;

data::SftLossTokens loss_tokens_of(const SftConfig& config) {
  return config.answer_only_loss ? data::SftLossTokens::kAnswerOnly : data::SftLossTokens::kPromptAndAnswer;
}

// Mean over the eval batches of the per-batch mean loss, then over ranks (step 1's evaluation).
// The batch losses stay on the model's device and are read once, at the end.
double evaluate_loss(models::CausalLM& model, engine::TrainingEngine& engine, const data::TokenizedDataset& eval,
                     const SftConfig& config, int64_t pad, const torch::Device& device, const StepContext& context) {
  model->eval();
  torch::NoGradGuard no_grad;
  data::DistributedSampler sampler(eval.size(), context_world(context), context_rank(context), /*shuffle=*/false);
  data::EpochBatches<data::SftBatch> batches(sampler, 0, config.per_device_eval_batch_size, false,
                                             [&](const std::vector<int64_t>& items) {
                                               return data::collate_sft(eval, items, {pad, std::nullopt},
                                                                        loss_tokens_of(config))
                                                   .pinned_for(device);
                                             });
  std::vector<torch::Tensor> batch_losses;  // each [] on the device
  while (auto host_batch = batches.next()) {
    const data::SftBatch batch = host_batch->to(device, /*non_blocking=*/true);
    torch::Tensor logits = model->forward(batch.input_ids, batch.attention_mask, nn::MaskLayout::kRightPadded);  // [B, T, V]
    batch_losses.push_back(causal_lm_loss(logits, batch.labels));
  }
  engine.release_gathered_parameters();
  model->train();
  double sum = 0.0;  // summed on the host in batch order, as a read per batch would have been
  for (double loss : read_to_host(batch_losses)) sum += loss;
  const int64_t count = static_cast<int64_t>(batch_losses.size());
  return all_reduce_mean(context, count > 0 ? sum / static_cast<double>(count) : 0.0);
}

}  // namespace

nlohmann::json SftResult::to_json() const {
  return {{"eval_loss_before", eval_loss_before}, {"eval_ppl_before", eval_ppl_before},
          {"eval_loss_after", eval_loss_after},   {"eval_ppl_after", eval_ppl_after},
          {"optimizer_steps", optimizer_steps},   {"seconds", seconds}};
}

namespace {

// What SFT's hooks use of the step's setup.
struct SftModel {
  models::CausalLM& model;
  std::unique_ptr<engine::TrainingEngine>& engine_owner;
  SupervisedData& data;
  monitor::MetricsLog& metrics;
  int64_t pad;
  torch::Device device;
  engine::TrainingEngine& engine() { return *engine_owner; }
};

// The end-of-text marker SFT appends to every answer: the tokenizer's eos, or eot_token.
std::string sft_eot_text(const SftConfig& config, const tokenizer::Tokenizer& tokenizer) {
  if (!config.common.add_eot_token) return eos_text_of(tokenizer);
  DSCHAT_CHECK(tokenizer.token_to_id(config.eot_token).has_value(), ConfigError, kSftStep, ": key 'eot_token' '",
               config.eot_token, "' is not a token of ", tokenizer.directory().string(),
               " (dschat cannot add tokens to a tokenizer; pick one it has)");
  return config.eot_token;
}

// Evaluation (perplexity before training and after each epoch) and the step reports.
void add_sft_reports(SupervisedLoop<data::SftBatch>& loop, const SftConfig& config, const StepContext& context,
                     SftModel& m, SftResult& result, MemoryPhase& memory) {
  loop.evaluate = [&](const EvaluationRequest& at) {
    const bool before = at.point == EvaluationPoint::kBeforeTraining;
    if (before) core::log_info("***** Running training *****");
    log_evaluation_banner("perplexity", at, config.common.num_train_epochs);
    memory.enter("evaluating perplexity", MemoryAdvice::kEvaluate);
    const double loss = evaluate_loss(m.model, m.engine(), m.data.phase.eval, config, m.pad, m.device, context);
    memory.enter("training", MemoryAdvice::kTrain);
    const double ppl = perplexity(static_cast<float>(loss));
    (before ? result.eval_loss_before : result.eval_loss_after) = loss;
    (before ? result.eval_ppl_before : result.eval_ppl_after) = ppl;
    if (at.point == EvaluationPoint::kResumedAtEnd) return;  // it only re-measures the summary's figures
    core::log_info("ppl: ", ppl, ", loss: ", loss);
    m.metrics.write("sft", at.step, {{"eval_loss", loss}, {"eval_ppl", ppl}});
  };
  if (config.print_loss) {  // DS-Chat's line per micro-batch: a read of every loss, so only on request
    loop.after_backward = [&context](const MicroBatchDone& done) {
      core::log_info("Epoch: ", done.epoch, ", Step: ", done.index, ", Rank: ", context_rank(context),
                     ", loss = ", done.loss);
    };
  }
  loop.on_optimizer_step = [&](const OptimizerStepDone& done, const data::SftBatch& batch) {
    const double mean_loss = all_reduce_mean(context, done.window_loss);
    const int64_t rows = m.data.micro * m.data.gas;
    m.metrics.write("sft", done.step,
                    {{"loss", mean_loss},
                     {"lr", done.learning_rates.front()},
                     {"samples_per_sec", static_cast<double>(rows * context_world(context)) / done.seconds}});
    log_step_throughput(done, rows, batch.input_ids.size(1), m.model->config(), config.model, config.common, context);
    return "loss " + std::to_string(mean_loss);
  };
}

SftResult run_sft_phases(const SftConfig& config, const StepContext& context, MemoryPhase& memory) {
  StepOpening open(kSftStep, config.output_dir, config.common, context, config.model_name_or_path);
  const int64_t pad = pad_token_of(open.tokenizer);
  const std::string eot = sft_eot_text(config, open.tokenizer);
  const torch::Device device = step_device(config.common, context, kSftStep);
  models::LoadOptions load = step_load_options(config.common, config.model, context, device);
  std::shared_ptr<models::DeferredParameters> deferred = defer_load_at_stage3(load, config.model.zero_stage);
  models::CausalLM model = models::load_causal_lm(config.model_name_or_path, load);
  prepare_trained_model(model, config.model, config.common, open.tokenizer, config.model_name_or_path,
                        config.max_seq_len, kSftStep);
  SupervisedData data = load_supervised_data(config.data, 1, config.common, config.max_seq_len, eot,
                                             config.per_device_train_batch_size, open.tokenizer, context);
  open.chat_format = sft_chat_format(data.phase.train, open.tokenizer);  // `dschat chat` prompts it the same way
  std::unique_ptr<engine::TrainingEngine> engine = make_training_engine(
      model.ptr(), config.common, config.model, data.micro, data.total_steps, context, kSftStep, std::move(deferred));
  monitor::MetricsLog metrics(open.runner.log_dir(), metrics_log_options(config.common, context));
  memory.enter("training", MemoryAdvice::kTrain);
  SftModel m{model, engine, data, metrics, pad, device};

  SftResult result;
  SupervisedLoop<data::SftBatch> loop;
  use_supervised_step(loop, config.common, context, metrics, "SFT", data.total_steps, 0);
  loop.on_resume = [&](const ResumePoint& at) {
    result.eval_loss_before = at.client_state.at("eval_loss_before").get<double>();
    result.eval_ppl_before = perplexity(static_cast<float>(result.eval_loss_before));
    result.resumed = true;
    log_resume(kSftStep, open.runner, at, " (optimizer step " + std::to_string(engine->global_steps()) + ")");
  };
  loop.client_state = [&] { return nlohmann::json{{"eval_loss_before", result.eval_loss_before}}; };
  add_sft_reports(loop, config, context, m, result, memory);
  loop.epoch_batches = [&](int64_t epoch) {
    return data::EpochBatches<data::SftBatch>(data.sampler, epoch, data.micro, false, [&](const std::vector<int64_t>& items) {
      return data::collate_sft(data.phase.train, items, {pad, std::nullopt}, loss_tokens_of(config)).pinned_for(device);
    });
  };
  loop.train_micro_batch = [&](const data::SftBatch& host_batch) {
    const data::SftBatch batch = host_batch.to(device, /*non_blocking=*/true);
    torch::Tensor logits = model->forward(batch.input_ids, batch.attention_mask, nn::MaskLayout::kRightPadded);  // [B, T, V]
    return causal_lm_loss(logits, batch.labels);                                    // []
  };
  loop.save_model = final_save(result, open, *engine, model->config(), config.output_dir, context, /*announce=*/true);
  run_supervised_step(loop, open, *engine);
  return result;
}

}  // namespace

SftResult run_sft(const SftConfig& config, const StepContext& context) {
  MemoryPhase memory{kSftStep, config.model_name_or_path};
  return with_memory_hint(memory, [&] { return run_sft_phases(config, context, memory); });
}

}  // namespace rlhf
}  // namespace dschat
