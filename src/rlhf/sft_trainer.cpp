#include "dschat/rlhf/sft_trainer.h"

#include <chrono>
#include <cmath>

#include "core/log.h"
#include "dschat/data/collate.h"
#include "dschat/data/epoch_batches.h"
#include "dschat/inference/model_loader.h"
#include "dschat/rlhf/metrics_log.h"
#include "dschat/rlhf/progress.h"
#include "dschat/rlhf/sft_loss.h"
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

// Mean over the eval batches of the per-batch mean loss, then over ranks (step 1's evaluation).
double evaluate_loss(models::CausalLM& model, engine::TrainingEngine& engine, const data::TokenizedDataset& eval,
                     const SftConfig& config, int64_t pad, const StepContext& context) {
  model->eval();
  torch::NoGradGuard no_grad;
  data::DistributedSampler sampler(eval.size(), context_world(context), context_rank(context), /*shuffle=*/false);
  data::EpochBatches<data::SftBatch> batches(sampler, 0, config.per_device_eval_batch_size, false,
                                             [&](const std::vector<int64_t>& items) {
                                               return data::collate_sft(eval, items, {pad, std::nullopt},
                                                                        config.answer_only_loss
                                                                            ? data::SftLossTokens::kAnswerOnly
                                                                            : data::SftLossTokens::kPromptAndAnswer);
                                             });
  double sum = 0.0;
  int64_t count = 0;
  while (auto batch = batches.next()) {
    torch::Tensor logits = model->forward(batch->input_ids, batch->attention_mask);  // [B, T, V]
    sum += causal_lm_loss(logits, batch->labels).item<double>();
    ++count;
  }
  engine.release_gathered_parameters();
  model->train();
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
  const std::string where = "step 1 (SFT)";
  const int64_t rank = context_rank(context), world = context_world(context);
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

  inference::LoadOptions load;
  load.dtype = step_dtype(config.common.dtype, where);
  load.random_init = context.random_init;
  load.dropout = config.model.dropout;
  models::CausalLM model = inference::load_causal_lm(config.model_name_or_path, load);
  check_vocab(model->config().vocab_size, tokenizer, config.model_name_or_path);
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
      make_training_engine(model.ptr(), config.common, config.model, micro, total_steps, context, where);
  engine::TrainingEngine& engine = *engine_owner;
  MetricsLog metrics(runner.log_dir(), metrics_log_options(config.common, context));
  auto evaluate = [&] {
    memory.enter("evaluating perplexity", MemoryAdvice::kEvaluate);
    const double loss = evaluate_loss(model, engine, phase.eval, config, pad, context);
    memory.enter("training", MemoryAdvice::kTrain);
    return loss;
  };
  memory.enter("training", MemoryAdvice::kTrain);

  SftResult result;
  int64_t start_epoch = 0, skip_batches = 0;
  if (runner.can_resume()) {
    const nlohmann::json state = engine.load_checkpoint(runner.checkpoint_dir());
    start_epoch = state.at("epoch").get<int64_t>();
    skip_batches = state.at("batch").get<int64_t>();
    result.eval_loss_before = state.at("eval_loss_before").get<double>();
    result.resumed = true;
    core::log_info(where, ": resuming from ", runner.checkpoint_dir().string(), " at epoch ", start_epoch,
                   ", micro-batch ", skip_batches, " (optimizer step ", engine.global_steps(), ")");
  } else {
    core::log_info("***** Running training *****");
    core::log_info("***** Evaluating perplexity, Epoch 0/", config.common.num_train_epochs, " *****");
    result.eval_loss_before = evaluate();
    core::log_info("ppl: ", perplexity(static_cast<float>(result.eval_loss_before)),
                   ", loss: ", result.eval_loss_before);
    metrics.write("sft", 0, {{"eval_loss", result.eval_loss_before},
                             {"eval_ppl", perplexity(static_cast<float>(result.eval_loss_before))}});
  }
  result.eval_ppl_before = perplexity(static_cast<float>(result.eval_loss_before));

  const data::SftLossTokens loss_tokens =
      config.answer_only_loss ? data::SftLossTokens::kAnswerOnly : data::SftLossTokens::kPromptAndAnswer;
  Progress progress("SFT", total_steps, config.common.print_interval, !context.progress);
  for (int64_t epoch = start_epoch; epoch < config.common.num_train_epochs; ++epoch) {
    core::log_info("Beginning of Epoch ", epoch + 1, "/", config.common.num_train_epochs,
                   ", Total Micro Batches ", batches_per_epoch);
    data::EpochBatches<data::SftBatch> batches(sampler, epoch, micro, false, [&](const std::vector<int64_t>& items) {
      return data::collate_sft(phase.train, items, {pad, std::nullopt}, loss_tokens);
    });
    int64_t batch_index = 0;
    double window_loss = 0.0;
    auto step_start = Clock::now();
    while (auto batch = batches.next()) {
      if (batch_index++ < skip_batches) continue;
      torch::Tensor logits = model->forward(batch->input_ids, batch->attention_mask);  // [B, T, V]
      torch::Tensor loss = causal_lm_loss(logits, batch->labels);                      // []
      engine.backward(loss);
      window_loss += loss.item<double>() / static_cast<double>(gas);
      if (config.print_loss) core::log_info("Epoch: ", epoch, ", Step: ", batch_index - 1, ", Rank: ", rank,
                                            ", loss = ", loss.item<double>());
      const bool boundary = engine.is_gradient_accumulation_boundary();
      engine.step();
      if (!boundary) continue;
      const double step_seconds = seconds_since(step_start);
      const int64_t step = engine.global_steps();
      const double mean_loss = all_reduce_mean(context, window_loss);
      metrics.write("sft", step, {{"loss", mean_loss},
                                  {"lr", engine.learning_rates().front()},
                                  {"samples_per_sec", static_cast<double>(micro * gas * world) / step_seconds}});
      if (rank == 0 && config.common.print_interval > 0 && step % config.common.print_interval == 0) {
        core::log_info(training_throughput_line(model->config(), micro * gas, batch->input_ids.size(1), step_seconds,
                                                config.model.gradient_checkpointing, config.model.lora_dim, world));
      }
      progress.update(step, "loss " + std::to_string(mean_loss));
      window_loss = 0.0;
      runner.after_optimizer_step(step, [&] {
        engine.save_checkpoint(runner.checkpoint_dir(), "",
                               {{"epoch", epoch}, {"batch", batch_index}, {"eval_loss_before", result.eval_loss_before}});
      });
      step_start = Clock::now();
    }
    skip_batches = 0;
    core::log_info("***** Evaluating perplexity, Epoch ", epoch + 1, "/", config.common.num_train_epochs, " *****");
    result.eval_loss_after = evaluate();
    result.eval_ppl_after = perplexity(static_cast<float>(result.eval_loss_after));
    core::log_info("ppl: ", result.eval_ppl_after, ", loss: ", result.eval_loss_after);
    metrics.write("sft", engine.global_steps(), {{"eval_loss", result.eval_loss_after},
                                                 {"eval_ppl", result.eval_ppl_after}});
    if (engine.is_gradient_accumulation_boundary()) {
      engine.save_checkpoint(runner.checkpoint_dir(), "",
                             {{"epoch", epoch + 1}, {"batch", 0}, {"eval_loss_before", result.eval_loss_before}});
    }
  }
  progress.finish();
  if (start_epoch >= config.common.num_train_epochs) {  // resumed after the last epoch's checkpoint
    result.eval_loss_after = evaluate();
    result.eval_ppl_after = perplexity(static_cast<float>(result.eval_loss_after));
  }
  result.optimizer_steps = engine.global_steps();
  result.seconds = seconds_since(start);
  core::log_info("saving the final model ...");
  save_trained_model(engine, model->config(), tokenizer, config.output_dir, result.to_json(), context);
  runner.finish();
  return result;
}

}  // namespace

SftResult run_sft(const SftConfig& config, const StepContext& context) {
  MemoryPhase memory{"step 1 (SFT)", config.model_name_or_path};
  return with_memory_hint(memory, [&] { return run_sft_phases(config, context, memory); });
}

}  // namespace rlhf
}  // namespace dschat
