#include "dschat/rlhf/supervised_loop.h"

#include "core/log.h"
#include "core/stopwatch.h"
#include "dschat/monitor/progress.h"
#include "dschat/monitor/throughput.h"
#include "dschat/rlhf/step_setup.h"

namespace dschat {
namespace rlhf {
namespace {

// A checkpoint's client state: the trainer's keys plus the data position a resume skips to.
nlohmann::json checkpoint_state(const SupervisedLoopSettings& settings, int64_t epoch, int64_t batch) {
  nlohmann::json state = settings.client_state ? settings.client_state() : nlohmann::json::object();
  DSCHAT_CHECK(state.is_object() && !state.contains("epoch") && !state.contains("batch"), InvalidArgument,
               "SupervisedLoop: client_state must be a JSON object without the loop's keys 'epoch' and 'batch', "
               "got ", state.dump());
  state["epoch"] = epoch;
  state["batch"] = batch;
  return state;
}

void evaluate(const SupervisedLoopSettings& settings, EvaluationPoint point, int64_t epoch, int64_t step) {
  if (settings.evaluate) settings.evaluate(EvaluationRequest{point, epoch, step});
}

// One epoch from micro-batch `skip` on (the ones before were consumed before a resume).
void run_epoch(const SupervisedLoopSettings& settings, StepRunner& runner, engine::TrainingEngine& engine,
               monitor::Progress& progress, SupervisedEpoch& data, int64_t epoch, int64_t skip) {
  const int64_t gas = engine.config().gradient_accumulation_steps;
  int64_t batch_index = 0, trained = 0;
  double loss_sum = 0.0, window_loss = 0.0;
  auto window_start = core::SteadyClock::now();
  while (data.next()) {
    // Fetched anyway: the skipped batches are collated so the epoch's order is the one they had.
    if (batch_index++ < skip) continue;
    torch::Tensor loss = data.loss();  // []
    engine.backward(loss);
    const double value = loss.item<double>();
    loss_sum += value;
    ++trained;
    window_loss += value / static_cast<double>(gas);
    if (settings.after_backward) settings.after_backward(MicroBatchDone{epoch, batch_index - 1, value});
    // Asked before step(), which advances the micro-step count the answer depends on.
    const bool boundary = engine.is_gradient_accumulation_boundary();
    engine.step();
    if (!boundary) continue;
    const OptimizerStepDone done{epoch, batch_index, engine.global_steps(), core::seconds_since(window_start),
                                 window_loss};
    const std::string extra = data.on_optimizer_step ? data.on_optimizer_step(done) : std::string();
    progress.update(done.step, extra);
    window_loss = 0.0;
    if (settings.eval_interval > 0 && done.step % settings.eval_interval == 0) {
      evaluate(settings, EvaluationPoint::kInterval, epoch, done.step);
    }
    runner.after_optimizer_step(done.step, [&] {
      engine.save_checkpoint(runner.checkpoint_dir(), "", checkpoint_state(settings, epoch, batch_index));
    });
    window_start = core::SteadyClock::now();
  }
  if (settings.on_epoch_end) {
    settings.on_epoch_end(EpochDone{epoch, trained, trained > 0 ? loss_sum / static_cast<double>(trained) : 0.0});
  }
}

}  // namespace

void log_step_throughput(const OptimizerStepDone& done, int64_t rows, int64_t sequence, const core::ModelConfig& model,
                         const ModelTrainingConfig& training, const CommonStepConfig& common,
                         const StepContext& context) {
  if (context_rank(context) != 0 || common.print_interval <= 0 || done.step % common.print_interval != 0) return;
  core::log_info(monitor::training_throughput_line(model, rows, sequence, done.seconds, training.gradient_checkpointing,
                                                   training.lora_dim, context_world(context)));
}

void SupervisedLoopSettings::use_step_config(const CommonStepConfig& common, const StepContext& context) {
  epochs = common.num_train_epochs;
  progress_interval = common.print_interval;
  plain_progress = !context.progress;
}

void run_supervised_loop(const SupervisedLoopSettings& settings, StepRunner& runner, engine::TrainingEngine& engine,
                         const std::function<SupervisedEpoch(int64_t epoch)>& begin_epoch) {
  DSCHAT_CHECK(settings.save_model && begin_epoch, InvalidArgument,
               "SupervisedLoop: save_model and the epoch source are required");
  DSCHAT_CHECK(settings.epochs >= 0, InvalidArgument, "SupervisedLoop: epochs is ", settings.epochs);
  int64_t start_epoch = 0, skip = 0;
  if (runner.can_resume()) {
    ResumePoint at;
    at.client_state = engine.load_checkpoint(runner.checkpoint_dir());
    at.epoch = at.client_state.at("epoch").get<int64_t>();
    at.micro_batch = at.client_state.at("batch").get<int64_t>();
    start_epoch = at.epoch;
    skip = at.micro_batch;
    if (settings.on_resume) settings.on_resume(at);
  } else {
    evaluate(settings, EvaluationPoint::kBeforeTraining, 0, engine.global_steps());
  }

  monitor::Progress progress(settings.progress_label, settings.progress_total, settings.progress_interval,
                             settings.plain_progress);
  for (int64_t epoch = start_epoch; epoch < settings.epochs; ++epoch) {
    SupervisedEpoch data = begin_epoch(epoch);
    core::log_info("Beginning of Epoch ", epoch + 1, "/", settings.epochs, ", Total Micro Batches ",
                   data.micro_batches);
    run_epoch(settings, runner, engine, progress, data, epoch, skip);
    skip = 0;
    evaluate(settings, EvaluationPoint::kEpochEnd, epoch, engine.global_steps());
    // Only where no accumulation window is open: a window running on into the next epoch has
    // gradients a checkpoint does not hold; the resume then starts from the last periodic one.
    if (engine.micro_steps() % engine.config().gradient_accumulation_steps == 0) {
      engine.save_checkpoint(runner.checkpoint_dir(), "", checkpoint_state(settings, epoch + 1, 0));
    }
  }
  progress.finish();
  if (start_epoch >= settings.epochs) {  // resumed from the last epoch's end checkpoint
    evaluate(settings, EvaluationPoint::kResumedAtEnd, settings.epochs, engine.global_steps());
  }
  settings.save_model();
  runner.finish();
}

}  // namespace rlhf
}  // namespace dschat
