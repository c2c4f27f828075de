#pragma once
// The phases steps 1 and 2 (SFT, the reward model, DPO) share around SupervisedLoop: the opening
// (clock, runner, seed, tokenizer), the trained model's preparation, the epoch data, the loop's
// settings, and the log lines of a resume, an evaluation and an epoch's end. Each trainer is then
// its model, its loss, its evaluation and its metrics.
#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/stopwatch.h"
#include "dschat/core/host_sync.h"
#include "dschat/data/prompt_dataset.h"
#include "dschat/data/sampler.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "dschat/rlhf/config/step_context.h"
#include "dschat/rlhf/setup/step_runner.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "dschat/rlhf/loop/supervised_loop.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace rlhf {

/// What every step starts with, in this order: the clock, the setup's named host sync (loading
/// copies host tensors in; named so the sync-debug test checks only the loop), the runner (which
/// checks output_dir), the seed, the tokenizer of `model_path`.
struct StepOpening {
  StepOpening(const std::string& where, const std::filesystem::path& output_dir, const CommonStepConfig& common,
              const StepContext& context, const std::string& model_path);
  core::SteadyClock::time_point start = core::SteadyClock::now();
  std::optional<core::HostSync> setup_sync;
  StepRunner runner;
  tokenizer::Tokenizer tokenizer;
  nlohmann::json chat_format;  // SFT: the data's conversation format, saved with the model (sft_chat_format)
  io::WeightsFormat save_format;  // the step's save_format
};

/// A supervised step's epochs: the phase's split, this rank's sampler over train, and the
/// optimizer steps of the whole run (the LR schedule's and the progress display's length).
struct SupervisedData {
  data::PhaseData phase;
  data::DistributedSampler sampler;
  int64_t micro = 1, gas = 1, total_steps = 0;
};
/// `phase_number` 1 (SFT) or 2 (pairs); `micro`: per_device_train_batch_size.
SupervisedData load_supervised_data(const DataConfig& data, int phase_number, const CommonStepConfig& common,
                                    int64_t max_seq_len, const std::string& eot_text, int64_t micro,
                                    const tokenizer::Tokenizer& tokenizer, const StepContext& context);

/// The trained model's checks and training setup: its vocabulary against the tokenizer, its
/// positions against max_seq_len, gradient checkpointing, LoRA (`lora_trained`: weights never
/// frozen with only_optimize_lora, e.g. the value head), train mode.
template <class Model>
void prepare_trained_model(Model& model, const ModelTrainingConfig& training, const CommonStepConfig& common,
                           const tokenizer::Tokenizer& tokenizer, const std::string& path, int64_t max_seq_len,
                           const std::string& where, const std::vector<std::string>& lora_trained = {}) {
  check_vocab(model->config().vocab_size, tokenizer, path);
  check_sequence_length(model->config(), max_seq_len, where + ": key 'max_seq_len'", path);
  model->backbone().set_gradient_checkpointing(training.gradient_checkpointing);
  apply_lora(*model, training, common.only_optimize_lora, lora_trained);
  model->train();
}

/// The loop's settings from the step (SupervisedLoopSettings::use_step_config), its metrics log,
/// progress label and total, and evaluation interval.
void use_supervised_step(SupervisedLoopSettings& loop, const CommonStepConfig& common, const StepContext& context,
                         monitor::MetricsLog& metrics, const std::string& label, int64_t total_steps,
                         int64_t eval_interval);

/// "<where>: resuming from <checkpoints> at epoch E, micro-batch B<detail>".
void log_resume(const std::string& where, const StepRunner& runner, const ResumePoint& at,
                const std::string& detail = "");
/// "***** Evaluating <what>, Epoch E/N *****" before training and after each epoch.
void log_evaluation_banner(const std::string& what, const EvaluationRequest& at, int64_t epochs);
/// The epoch's mean training loss over the ranks, logged "Epoch E/N with loss L".
double log_epoch_loss(const EpochDone& done, int64_t epochs, const StepContext& context);

/// The loop's final save: the result's optimizer steps and seconds, then the model as a Hugging
/// Face directory with the result as its summary ("saving the final model ..." logged first when
/// `announce`).
template <class Result>
std::function<void()> final_save(Result& result, const StepOpening& open, engine::TrainingEngine& engine,
                                 const core::ModelConfig& model_config, const std::filesystem::path& output_dir,
                                 const StepContext& context, bool announce) {
  return [&result, &open, &engine, &model_config, output_dir, &context, announce] {
    result.optimizer_steps = engine.global_steps();
    result.seconds = core::seconds_since(open.start);
    if (announce) core::log_info("saving the final model ...");
    save_trained_model(engine, model_config, open.tokenizer, output_dir, result.to_json(), context, open.chat_format,
                       open.save_format);
  };
}

/// Ends the setup's host sync and runs the loop to its final save.
template <class Batch>
void run_supervised_step(const SupervisedLoop<Batch>& loop, StepOpening& open, engine::TrainingEngine& engine) {
  open.setup_sync.reset();
  loop.run(open.runner, engine);
}

}  // namespace rlhf
}  // namespace dschat
