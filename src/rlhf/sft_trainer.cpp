#include "dschat/core/host_sync.h"
#include "dschat/rlhf/sft_trainer.h"

#include "core/stopwatch.h"
#include "core/log.h"
#include "dschat/data/collate.h"
#include "dschat/data/epoch_batches.h"
#include "dschat/models/load_save.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/rlhf/sft_loss.h"
#include "rlhf/memory_hint.h"
#include "dschat/rlhf/step_runner.h"
#include "dschat/rlhf/step_setup.h"
#include "dschat/rlhf/supervised_loop.h"

namespace dschat {
namespace rlhf {
namespace {

// Names the step in messages and in out-of-memory errors.
constexpr char kStep[] = "step 1 (SFT)";

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

SftResult run_sft_phases(const SftConfig& config, const StepContext& context, MemoryPhase& memory) {
  const auto start = Clock::now();
  const std::string where = kStep;
  const int64_t rank = context_rank(context), world = context_world(context);
  // Loading copies host tensors in: named, so the sync-debug test checks only the loop.
  std::optional<core::HostSync> setup_sync(std::in_place, "step setup (models, engines, data)");
  StepRunner runner(where, config.output_dir, config.common, context);
  torch::manual_seed(config.common.seed);

  auto tokenizer = load_step_tokenizer(context, config.model_name_or_path);
  const int64_t pad = pad_token_of(tokenizer);
  std::string eot = eos_text_of(tokenizer);
  if (config.common.add_eot_token) {
    DSCHAT_CHECK(tokenizer.token_to_id(config.eot_token).has_value(), ConfigError, where, ": key 'eot_token' '",
                 config.eot_token, "' is not a token of ", tokenizer.directory().string(),
                 " (dschat cannot add tokens to a tokenizer; pick one it has)");
    eot = config.eot_token;
  }

  const torch::Device device = step_device(config.common, context, where);
  models::LoadOptions load = step_load_options(config.common, config.model, context, device, where);
  std::shared_ptr<models::DeferredParameters> deferred = defer_load_at_stage3(load, config.model.zero_stage);
  models::CausalLM model = models::load_causal_lm(config.model_name_or_path, load);
  check_vocab(model->config().vocab_size, tokenizer, config.model_name_or_path);
  check_sequence_length(model->config(), config.max_seq_len, where + ": key 'max_seq_len'", config.model_name_or_path);
  model->backbone().set_gradient_checkpointing(config.model.gradient_checkpointing);
  apply_lora(*model, config.model, config.common.only_optimize_lora);
  model->train();

  data::PhaseData phase = data::create_prompt_dataset(
      prompt_data_options(config.data, 1, config.common.seed, config.max_seq_len, eot), tokenizer);
  data::DistributedSampler sampler(phase.train.size(), world, rank, /*shuffle=*/true, config.common.seed);
  const int64_t micro = config.per_device_train_batch_size;
  const int64_t batches_per_epoch = (sampler.num_samples() + micro - 1) / micro;
  const int64_t gas = config.common.gradient_accumulation_steps;
  const int64_t total_steps = optimizer_steps_for(config.common.num_train_epochs, batches_per_epoch, gas);

  std::unique_ptr<engine::TrainingEngine> engine_owner =
      make_training_engine(model.ptr(), config.common, config.model, micro, total_steps, context, where,
                           std::move(deferred));
  engine::TrainingEngine& engine = *engine_owner;
  monitor::MetricsLog metrics(runner.log_dir(), metrics_log_options(config.common, context));
  memory.enter("training", MemoryAdvice::kTrain);

  SftResult result;
  SupervisedLoop<data::SftBatch> loop;
  loop.use_step_config(config.common, context);
  loop.metrics = &metrics;
  loop.progress_label = "SFT";
  loop.progress_total = total_steps;
  loop.on_resume = [&](const ResumePoint& at) {
    result.eval_loss_before = at.client_state.at("eval_loss_before").get<double>();
    result.eval_ppl_before = perplexity(static_cast<float>(result.eval_loss_before));
    result.resumed = true;
    core::log_info(where, ": resuming from ", runner.checkpoint_dir().string(), " at epoch ", at.epoch,
                   ", micro-batch ", at.micro_batch, " (optimizer step ", engine.global_steps(), ")");
  };
  loop.client_state = [&] { return nlohmann::json{{"eval_loss_before", result.eval_loss_before}}; };
  loop.evaluate = [&](const EvaluationRequest& at) {
    const bool before = at.point == EvaluationPoint::kBeforeTraining;
    if (before) core::log_info("***** Running training *****");
    if (at.point != EvaluationPoint::kResumedAtEnd) {  // which only re-measures the summary's figures
      core::log_info("***** Evaluating perplexity, Epoch ", before ? 0 : at.epoch + 1, "/",
                     config.common.num_train_epochs, " *****");
    }
    memory.enter("evaluating perplexity", MemoryAdvice::kEvaluate);
    const double loss = evaluate_loss(model, engine, phase.eval, config, pad, device, context);
    memory.enter("training", MemoryAdvice::kTrain);
    const double ppl = perplexity(static_cast<float>(loss));
    (before ? result.eval_loss_before : result.eval_loss_after) = loss;
    (before ? result.eval_ppl_before : result.eval_ppl_after) = ppl;
    if (at.point == EvaluationPoint::kResumedAtEnd) return;
    core::log_info("ppl: ", ppl, ", loss: ", loss);
    metrics.write("sft", at.step, {{"eval_loss", loss}, {"eval_ppl", ppl}});
  };
  loop.epoch_batches = [&](int64_t epoch) {
    return data::EpochBatches<data::SftBatch>(sampler, epoch, micro, false, [&](const std::vector<int64_t>& items) {
      return data::collate_sft(phase.train, items, {pad, std::nullopt}, loss_tokens_of(config)).pinned_for(device);
    });
  };
  loop.train_micro_batch = [&](const data::SftBatch& host_batch) {
    const data::SftBatch batch = host_batch.to(device, /*non_blocking=*/true);
    torch::Tensor logits = model->forward(batch.input_ids, batch.attention_mask, nn::MaskLayout::kRightPadded);  // [B, T, V]
    return causal_lm_loss(logits, batch.labels);                                    // []
  };
  if (config.print_loss) {  // DS-Chat's line per micro-batch: a read of every loss, so only on request
    loop.after_backward = [&](const MicroBatchDone& done) {
      core::log_info("Epoch: ", done.epoch, ", Step: ", done.index, ", Rank: ", rank, ", loss = ", done.loss);
    };
  }
  loop.on_optimizer_step = [&](const OptimizerStepDone& done, const data::SftBatch& batch) {
    const double mean_loss = all_reduce_mean(context, done.window_loss);
    metrics.write("sft", done.step, {{"loss", mean_loss},
                                     {"lr", done.learning_rates.front()},
                                     {"samples_per_sec", static_cast<double>(micro * gas * world) / done.seconds}});
    log_step_throughput(done, micro * gas, batch.input_ids.size(1), model->config(), config.model, config.common,
                        context);
    return "loss " + std::to_string(mean_loss);
  };
  loop.save_model = [&] {
    result.optimizer_steps = engine.global_steps();
    result.seconds = seconds_since(start);
    core::log_info("saving the final model ...");
    save_trained_model(engine, model->config(), tokenizer, config.output_dir, result.to_json(), context);
  };
  setup_sync.reset();
  loop.run(runner, engine);
  return result;
}

}  // namespace

SftResult run_sft(const SftConfig& config, const StepContext& context) {
  MemoryPhase memory{kStep, config.model_name_or_path};
  return with_memory_hint(memory, [&] { return run_sft_phases(config, context, memory); });
}

}  // namespace rlhf
}  // namespace dschat
