#include "dschat/core/host_sync.h"
#include "dschat/rlhf/supervised_loop.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/stopwatch.h"
#include "core/tensor_util.h"
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
  core::HostSync sync("evaluation (perplexity / reward accuracy)");
  if (settings.evaluate) settings.evaluate(EvaluationRequest{point, epoch, step});
}

// The micro-batch losses of one epoch, left on the device until a read point; then one copy
// brings them to the host, where they are summed in micro-batch order exactly as an immediate
// `loss.item<double>()` each would have been, and the reports of the steps ended since run.
class EpochLosses {
 public:
  EpochLosses(int64_t gas, monitor::Progress& progress) : gas_(static_cast<double>(gas)), progress_(progress) {}

  void add(const torch::Tensor& loss) {
    unread_.push_back(loss.detach());  // []
    ++trained_;
  }

  // The step `done` ends the window of the losses added so far; `report` runs at the next read.
  void end_window(const OptimizerStepDone& done, StepReport report) {
    pending_.push_back(PendingStep{done, unread_.size(), std::move(report)});
  }

  // The one host read: every unread loss, then the pending reports in step order.
  void read() {
    if (unread_.empty() && pending_.empty()) return;
    const std::vector<double> values = read_to_host(unread_);
    size_t next = 0;
    for (PendingStep& step : pending_) {
      for (; next < step.losses_before; ++next) accumulate(values[next]);
      step.done.window_loss = window_loss_;
      const std::string extra = step.report ? step.report(step.done) : std::string();
      progress_.update(step.done.step, extra);
      window_loss_ = 0.0;
    }
    for (; next < values.size(); ++next) accumulate(values[next]);
    unread_.clear();
    pending_.clear();
  }

  int64_t trained() const { return trained_; }
  // Only after read().
  double mean_loss() const { return trained_ > 0 ? loss_sum_ / static_cast<double>(trained_) : 0.0; }

 private:
  struct PendingStep {
    OptimizerStepDone done;
    size_t losses_before = 0;  // unread losses up to this step's window end
    StepReport report;
  };

  void accumulate(double value) {
    loss_sum_ += value;
    window_loss_ += value / gas_;
  }

  double gas_;
  monitor::Progress& progress_;
  std::vector<torch::Tensor> unread_;  // each [], on the loss's device
  std::vector<PendingStep> pending_;
  int64_t trained_ = 0;
  double loss_sum_ = 0.0, window_loss_ = 0.0;
};

// One epoch from micro-batch `skip` on (the ones before were consumed before a resume).
void run_epoch(const SupervisedLoopSettings& settings, StepRunner& runner, engine::TrainingEngine& engine,
               monitor::Progress& progress, SupervisedEpoch& data, int64_t epoch, int64_t skip) {
  const int64_t read_interval = std::max<int64_t>(settings.progress_interval, 1);
  EpochLosses losses(engine.config().gradient_accumulation_steps, progress);
  int64_t batch_index = 0;
  auto window_start = core::SteadyClock::now();
  while (data.next()) {
    // Fetched anyway: the skipped batches are collated so the epoch's order is the one they had.
    if (batch_index++ < skip) continue;
    torch::Tensor loss = data.loss();  // []
    engine.backward(loss);
    losses.add(loss);
    if (settings.after_backward) {  // DS-Chat's per-micro-step loss line: a read per micro-step, on request
      core::HostSync sync("statistics (print_loss: every micro-step, on request)");
      settings.after_backward(MicroBatchDone{epoch, batch_index - 1, loss.item<double>()});
    }
    // Asked before step(), which advances the micro-step count the answer depends on.
    const bool boundary = engine.is_gradient_accumulation_boundary();
    engine.step();
    if (!boundary) continue;
    OptimizerStepDone done{epoch, batch_index, engine.global_steps(), core::seconds_since(window_start), 0.0,
                           engine.learning_rates()};
    losses.end_window(done, data.step_report ? data.step_report() : StepReport());
    const bool evaluate_now = settings.eval_interval > 0 && done.step % settings.eval_interval == 0;
    if (evaluate_now || done.step % read_interval == 0) losses.read();
    if (evaluate_now) evaluate(settings, EvaluationPoint::kInterval, epoch, done.step);
    runner.after_optimizer_step(done.step, [&](engine::AsyncCheckpointWriter* background) {
      losses.read();  // the reports of the steps before a checkpoint (and a Ctrl-C) are never lost
      engine.save_checkpoint(runner.checkpoint_dir(), "", checkpoint_state(settings, epoch, batch_index), background);
    });
    window_start = core::SteadyClock::now();
  }
  losses.read();
  if (settings.on_epoch_end) settings.on_epoch_end(EpochDone{epoch, losses.trained(), losses.mean_loss()});
}

}  // namespace

std::vector<double> read_to_host(const std::vector<torch::Tensor>& scalars) {
  if (scalars.empty()) return {};
  std::vector<torch::Tensor> rows;  // each [1]
  rows.reserve(scalars.size());
  for (const torch::Tensor& t : scalars) {
    DSCHAT_CHECK(t.defined() && t.numel() == 1, InvalidArgument, "read_to_host: expected scalar tensors, got ",
                 t.defined() ? core::shape_of(t) : "undefined");
    rows.push_back(t.detach().reshape({1}).to(torch::kFloat64));  // exact for every float and int below 2^53
  }
  core::HostSync sync("statistics (every print_interval)");
  torch::Tensor host = torch::cat(rows).to(torch::kCPU).contiguous();  // [n]: the copy is the one wait
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

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
  if (runner.prepare_resume()) {
    ResumePoint at;
    core::HostSync sync("step setup (models, engines, data)");
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
      runner.save_checkpoint([&](engine::AsyncCheckpointWriter* background) {
        engine.save_checkpoint(runner.checkpoint_dir(), "", checkpoint_state(settings, epoch + 1, 0), background);
      });
    }
  }
  progress.finish();
  if (start_epoch >= settings.epochs) {  // resumed from the last epoch's end checkpoint
    evaluate(settings, EvaluationPoint::kResumedAtEnd, settings.epochs, engine.global_steps());
  }
  core::HostSync sync("step end (evaluation, save)");
  // The end-of-training checkpoint is committed before the model is written: a failure there
  // resumes from it rather than from the one before.
  runner.wait_for_checkpoints();
  settings.save_model();
  runner.finish();
}

}  // namespace rlhf
}  // namespace dschat
