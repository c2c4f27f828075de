#pragma once
// A guarded supervised run small enough for a test, shared by tests/rlhf/guardian_loop_test.cpp
// (one process) and tests/rlhf/guardian_worker.cpp (the ranks of the 2-rank ZeRO 0-3 test): the
// tiny OPT fixture (opt-preln) learns the next tokens of 12 random rows, 2 rows a micro-batch per
// rank, one micro-batch an optimizer step (or `gas`), `epochs` epochs, through
// rlhf::run_supervised_loop with the guardian on. Faults are injected by (epoch, micro-batch)
// position: a NaN in the gradient (a hook on the logits' gradient: the loss stays finite), or a
// loss spike (the loss times 50). `omit` leaves positions out of the data altogether: the run that
// never saw the offending batch.
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dschat/data/epoch_batches.h"
#include "dschat/data/sampler.h"
#include "dschat/engine/training_engine.h"
#include "dschat/models/load_save.h"
#include "dschat/monitor/metrics_log.h"
#include "dschat/rlhf/math/sft_loss.h"
#include "dschat/rlhf/setup/step_runner.h"
#include "dschat/rlhf/loop/supervised_loop.h"
#include "test_util.h"

namespace dschat {
namespace testing {

struct ToyFault {
  std::string kind;  // "" | "nan_grad" | "spike"
  int64_t epoch = -1, batch = -1;
  bool once = true;    // a transient fault: it fires the first time the position trains only
  int64_t rank = 0;    // the rank whose batch carries it
};

struct ToyRunOptions {
  std::filesystem::path dir;  // the step's output directory (checkpoints, logs, snapshots beside it)
  monitor::GuardianConfig guardian;
  ToyFault fault;
  std::set<std::pair<int64_t, int64_t>> omit;  // (epoch, micro-batch) left out of the data
  int stage = 0;
  int64_t epochs = 3;
  int64_t gas = 1;
  std::shared_ptr<dist::Communicator> communicator;
};

struct ToyRunResult {
  std::map<std::string, torch::Tensor> parameters;  // consolidated, at the end
  int64_t global_steps = 0;
  int64_t faults_fired = 0;
  std::string stopped;  // the GuardianStop message, "" when the run finished
};

inline ToyRunResult run_toy_guarded(const ToyRunOptions& o) {
  constexpr int64_t kRowsPerRank = 12, kMicro = 2, kLength = 8;
  const int64_t world = o.communicator ? o.communicator->world_size() : 1;
  const int64_t rank = o.communicator ? o.communicator->rank() : 0;
  torch::manual_seed(21);
  const torch::Tensor rows = torch::randint(3, 512, {kRowsPerRank * world, kLength}, torch::kInt64);  // [R, T] int64
  torch::manual_seed(1234);
  models::CausalLM model = models::load_causal_lm(fixture("opt-preln").string());
  model->train();
  engine::TrainingEngineOptions engine_options;
  engine_options.config = engine::DeepSpeedConfig::parse(
      {{"train_batch_size", kMicro * o.gas * world},
       {"train_micro_batch_size_per_gpu", kMicro},
       {"gradient_accumulation_steps", o.gas},
       {"steps_per_print", 0},
       {"zero_optimization", {{"stage", o.stage}, {"stage3_param_persistence_threshold", 64}}}},
      world, "toy guarded run");
  engine_options.optimizer.lr = 1e-2;
  engine_options.communicator = o.communicator;
  engine::TrainingEngine engine(model.ptr(), engine_options);

  rlhf::CommonStepConfig common;
  common.guardian = o.guardian;
  rlhf::StepContext context;
  context.progress = false;
  context.communicator = o.communicator;
  rlhf::StepRunner runner("toy step", o.dir, common, context);
  monitor::MetricsLogOptions log_options;
  log_options.rank0 = rank == 0;
  monitor::MetricsLog metrics(runner.log_dir(), log_options);
  data::DistributedSampler sampler(kRowsPerRank * world, world, rank, /*shuffle=*/true, /*seed=*/7);

  ToyRunResult result;
  std::set<std::pair<int64_t, int64_t>> fired;
  rlhf::SupervisedLoopSettings settings;
  settings.epochs = o.epochs;
  settings.plain_progress = true;
  settings.progress_label = "toy";
  settings.guardian = o.guardian;
  settings.metrics = &metrics;
  settings.save_model = [] {};
  auto begin_epoch = [&](int64_t epoch) {
    struct State {
      data::EpochBatches<torch::Tensor> batches;
      torch::Tensor current;  // [B, T] int64
      int64_t index = -1;     // the fetched micro-batch's position in the epoch
    };
    auto state = std::make_shared<State>(State{
        data::EpochBatches<torch::Tensor>(sampler, epoch, kMicro, false,
                                          [&rows](const std::vector<int64_t>& items) {
                                            return rows.index_select(0, torch::tensor(items, torch::kInt64));
                                          }),
        torch::Tensor(), -1});
    rlhf::SupervisedEpoch out;
    out.micro_batches = state->batches.size();
    int64_t position = -1;  // every fetched batch's position, the omitted ones counted
    out.next = [state, position, epoch, &o]() mutable {
      while (auto batch = state->batches.next()) {
        ++position;
        if (o.omit.count({epoch, position})) continue;
        state->current = *batch;
        ++state->index;
        return true;
      }
      return false;
    };
    out.loss = [state, epoch, rank, &o, &model, &fired, &result]() -> torch::Tensor {
      const ToyFault& f = o.fault;
      const bool fault_here = !f.kind.empty() && f.epoch == epoch && f.batch == state->index && f.rank == rank &&
                              !(f.once && fired.count({epoch, state->index}));
      torch::Tensor logits = model->forward(state->current);  // [B, T, V]
      if (fault_here) {
        fired.insert({epoch, state->index});
        ++result.faults_fired;
        if (f.kind == "nan_grad") {
          logits.register_hook([](torch::Tensor grad) { return grad * std::nan(""); });
        }
      }
      torch::Tensor loss = rlhf::causal_lm_loss(logits, state->current);  // []
      return fault_here && f.kind == "spike" ? loss * 50.0 : loss;
    };
    return out;
  };
  try {
    rlhf::run_supervised_loop(settings, runner, engine, begin_epoch);
  } catch (const monitor::GuardianStop& stop) {
    result.stopped = stop.what();
  }
  result.parameters = engine.consolidated_parameters();
  result.global_steps = engine.global_steps();
  return result;
}

/// The guardian's rows of a run's metrics.jsonl.
inline std::vector<monitor::MetricsRow> guardian_rows(const std::filesystem::path& dir) {
  std::vector<monitor::MetricsRow> out;
  const std::filesystem::path file = dir.parent_path() / (dir.filename().string() + "_logs") / "metrics.jsonl";
  if (!std::filesystem::exists(file)) return out;
  for (monitor::MetricsRow& row : monitor::read_metrics_jsonl(file)) {
    if (row.phase == "guardian") out.push_back(std::move(row));
  }
  return out;
}

/// A guardian whose rollbacks leave the run comparable with one that never saw the fault: the
/// same learning rate, the same seeds.
inline monitor::GuardianConfig exact_rollback_guardian(const std::string& batches) {
  monitor::GuardianConfig g;
  g.snapshot_interval = 3;
  g.lr_factor = 1.0;
  g.reseed = false;
  g.batches = batches;
  g.loss_spike.threshold = 5.0;
  g.loss_spike_min_steps = 2;
  return g;
}

}  // namespace testing
}  // namespace dschat
