#include "rlhf/loop/supervised_step.h"

#include "core/log.h"

namespace dschat {
namespace rlhf {

namespace {

// Seeds every random draw of the step (model initialisation, dropout, shuffles) before the first.
tokenizer::Tokenizer seed_then_load_tokenizer(const CommonStepConfig& common, const StepContext& context,
                                              const std::string& model_path) {
  torch::manual_seed(common.seed);
  return load_step_tokenizer(context, model_path);
}

}  // namespace

StepOpening::StepOpening(const std::string& where, const std::filesystem::path& output_dir,
                         const CommonStepConfig& common, const StepContext& context, const std::string& model_path)
    : setup_sync(std::in_place, "step setup (models, engines, data)"),
      runner(where, output_dir, common, context),
      tokenizer(seed_then_load_tokenizer(common, context, model_path)),
      save_format(common.save_format) {}

SupervisedData load_supervised_data(const DataConfig& data, int phase_number, const CommonStepConfig& common,
                                    int64_t max_seq_len, const std::string& eot_text, int64_t micro,
                                    const tokenizer::Tokenizer& tokenizer, const StepContext& context) {
  data::PhaseData phase = data::create_prompt_dataset(
      prompt_data_options(data, phase_number, common.seed, max_seq_len, eot_text), tokenizer);
  data::DistributedSampler sampler(phase.train.size(), context_world(context), context_rank(context),
                                   /*shuffle=*/true, common.seed);
  const int64_t batches_per_epoch = (sampler.num_samples() + micro - 1) / micro;
  const int64_t gas = common.gradient_accumulation_steps;
  const int64_t total_steps = optimizer_steps_for(common.num_train_epochs, batches_per_epoch, gas);
  return SupervisedData{std::move(phase), std::move(sampler), micro, gas, total_steps};
}

void use_supervised_step(SupervisedLoopSettings& loop, const CommonStepConfig& common, const StepContext& context,
                         monitor::MetricsLog& metrics, const std::string& label, int64_t total_steps,
                         int64_t eval_interval) {
  loop.use_step_config(common, context);
  loop.metrics = &metrics;
  loop.eval_interval = eval_interval;
  loop.progress_label = label;
  loop.progress_total = total_steps;
}

void log_resume(const std::string& where, const StepRunner& runner, const ResumePoint& at, const std::string& detail) {
  core::log_info(where, ": resuming from ", runner.checkpoint_dir().string(), " at epoch ", at.epoch, ", micro-batch ",
                 at.micro_batch, detail);
}

void log_evaluation_banner(const std::string& what, const EvaluationRequest& at, int64_t epochs) {
  const bool before = at.point == EvaluationPoint::kBeforeTraining;
  if (!before && at.point != EvaluationPoint::kEpochEnd) return;
  core::log_info("***** Evaluating ", what, ", Epoch ", before ? 0 : at.epoch + 1, "/", epochs, " *****");
}

double log_epoch_loss(const EpochDone& done, int64_t epochs, const StepContext& context) {
  const double loss = all_reduce_mean(context, done.mean_loss);
  core::log_info("Epoch ", done.epoch + 1, "/", epochs, " with loss ", loss);
  return loss;
}

}  // namespace rlhf
}  // namespace dschat
