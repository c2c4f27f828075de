// rlhf::PolicyLoop driven by a toy PolicyAlgorithm, without PPO or GRPO: the tiny OPT fixture
// learns its own prompts (a language-model loss on them stands in for a policy loss), so the
// loop's contract is checked on its own: the call order, each step's prompt batches, the seeds,
// resume at the exact batch with the algorithm's state, stop_after_step, collected data carried
// over or dropped at an epoch's end, and a guardian rollback that skips the offending batches.
// 10 prompts in batches of 2: 5 prompt batches an epoch, 2 epochs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dschat/engine/training_engine.h"
#include "dschat/models/load_save.h"
#include "dschat/rlhf/loop/policy_loop.h"
#include "dschat/rlhf/math/sft_loss.h"
#include "rlhf/setup/step_runner_testing.h"
#include "test_util.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kPrompts = 10, kBatch = 2, kPromptLength = 6;

// What a run's hooks saw, in order.
struct Record {
  std::vector<std::string> events;
  std::vector<rlhf::PolicyStep> steps;
  std::set<uint64_t> seeds;
  std::map<int64_t, std::multiset<int64_t>> marks;  // per epoch, the marks of the prompts collected
  std::optional<json> restored;           // the state restore() was given (the last one)
  int64_t saved_steps = -1;               // save_outputs' count
  std::map<std::string, torch::Tensor> parameters;
};

// Collects `batches_per_step` prompt batches, then one optimizer step on their LM loss. At the
// step numbered `nan_at_step` (once) it reports a NaN loss, which the guardian rolls back.
class ToyAlgorithm : public rlhf::PolicyAlgorithm {
 public:
  ToyAlgorithm(models::CausalLM model, engine::TrainingEngine& engine, Record& record, int64_t batches_per_step,
               int64_t nan_at_step)
      : model_(std::move(model)), engine_(engine), r_(record), per_step_(batches_per_step), nan_at_(nan_at_step) {}

  torch::Device device() const override { return torch::kCPU; }
  std::vector<engine::TrainingEngine*> engines() override { return {&engine_}; }
  json state() const override { return {{"toy_steps", toy_steps_}}; }
  void restore(const json& state) override {
    r_.restored = state;
    toy_steps_ = state.at("toy_steps").get<int64_t>();
    r_.events.push_back("restore " + std::to_string(toy_steps_));
  }
  double heldout_score(const data::PromptBatch&) override { return 0.0; }
  void start(rlhf::PolicyLoop& loop) override {
    r_.events.push_back("start step " + std::to_string(loop.step()) + (loop.resumed() ? " resumed" : ""));
  }
  rlhf::Collected collect(const data::PromptBatch& batch, const rlhf::PolicyBatch& at) override {
    r_.events.push_back("collect e" + std::to_string(at.epoch) + " b" + std::to_string(at.index) + " s" +
                        std::to_string(at.step));
    r_.seeds.insert(at.sample_seed);
    for (int64_t row = 0; row < batch.input_ids.size(0); ++row) {
      r_.marks[at.epoch].insert(batch.input_ids[row][kPromptLength - 1].item<int64_t>());
    }
    collected_.push_back(batch.input_ids);
    return static_cast<int64_t>(collected_.size()) < per_step_ ? rlhf::Collected::kCollected
                                                               : rlhf::Collected::kStepReady;
  }
  std::optional<monitor::StepFigures> train(const rlhf::PolicyStep& step) override {
    r_.steps.push_back(step);
    r_.events.push_back("train " + std::to_string(step.step) + " [" + std::to_string(step.first_batch) + "," +
                        std::to_string(step.end_batch) + ")");
    const torch::Tensor ids = torch::cat(collected_, 0);  // [per_step * 2, P]
    collected_.clear();
    torch::Tensor loss = rlhf::causal_lm_loss(model_->forward(ids), ids);  // []
    engine_.backward(loss);
    engine_.step();
    ++toy_steps_;
    monitor::StepFigures figures;
    figures.step = step.step;
    figures.loss = loss.item<double>();
    if (step.step == nan_at_) {
      nan_at_ = -1;
      figures.loss = std::nan("");
    }
    return figures;
  }
  void drop_collected() override {
    r_.events.push_back("drop " + std::to_string(collected_.size()));
    collected_.clear();
  }
  void save_outputs(int64_t steps) override {
    r_.events.push_back("save " + std::to_string(steps));
    r_.saved_steps = steps;
  }

 private:
  models::CausalLM model_;
  engine::TrainingEngine& engine_;
  Record& r_;
  int64_t per_step_, nan_at_;
  int64_t toy_steps_ = 0;
  std::vector<torch::Tensor> collected_;  // each [2, P] int64
};

struct RunOptions {
  int64_t batches_per_step = 2;
  bool steps_span_epochs = false;
  int64_t stop_after_step = 0;
  int64_t checkpoint_interval = 0;
  int64_t nan_at_step = -1;
};

class PolicyLoopTest : public ::testing::Test {
 protected:
  PolicyLoopTest() {
    phase_.train = data::TokenizedDataset(data::PhaseKind::kPrompt);
    for (int64_t i = 0; i < kPrompts; ++i) {
      std::vector<int64_t> ids;
      for (int64_t t = 0; t < kPromptLength; ++t) ids.push_back(3 + (i * 7 + t * 13) % 500);
      ids.back() = 100 + i;  // the prompt's own mark
      phase_.train.append({&ids});
    }
  }

  Record run(const std::string& name, const RunOptions& options) {
    Record r;
    torch::manual_seed(1234);
    models::CausalLM model = models::load_causal_lm(testing::fixture("opt-preln").string());
    model->train();
    engine::TrainingEngineOptions engine_options;
    engine_options.config = engine::DeepSpeedConfig::parse(
        {{"train_batch_size", kBatch * options.batches_per_step},
         {"train_micro_batch_size_per_gpu", kBatch * options.batches_per_step}},
        1, "test");
    engine_options.optimizer.lr = 1e-3;
    engine::TrainingEngine engine(model.ptr(), engine_options);

    rlhf::StepContext context;
    context.progress = false;
    rlhf::PolicyLoopSettings settings;
    settings.where = "toy policy step";
    settings.progress_name = "toy";
    settings.output_dir = tmp_ / name;
    settings.common.num_train_epochs = 2;
    settings.common.checkpoint_interval = options.checkpoint_interval;
    settings.common.guardian.heldout_interval = 0;
    settings.common.guardian.snapshot_interval = 1;
    settings.generation_batch_size = kBatch;
    settings.generation_batches = options.batches_per_step;
    settings.prompt_length = kPromptLength;
    settings.steps_span_epochs = options.steps_span_epochs;
    settings.stop_after_step = options.stop_after_step;
    rlhf::PolicyLoop loop(settings, context);
    loop.set_prompts(phase_, /*pad_token_id=*/1);
    EXPECT_EQ(loop.steps_per_epoch(), 5);
    ToyAlgorithm algorithm(model, engine, r, options.batches_per_step, options.nan_at_step);
    loop.run(algorithm);
    for (const auto& item : model->named_parameters()) r.parameters[item.key()] = item.value().detach().clone();
    return r;
  }

  testing::TempDir tmp_;
  data::PhaseData phase_;  // 10 prompts of 6 tokens, the last one each prompt's mark 100 + i
};

TEST_F(PolicyLoopTest, StepsGatherTheirBatchesAndAnEpochsRemainderIsDropped) {
  const Record r = run("plain", {});
  const std::vector<std::string> expected = {
      "start step 0",     "collect e0 b0 s1", "collect e0 b1 s1", "train 1 [0,2)", "collect e0 b2 s2",
      "collect e0 b3 s2", "train 2 [2,4)",    "collect e0 b4 s3", "drop 1",        "collect e1 b0 s3",
      "collect e1 b1 s3", "train 3 [0,2)",    "collect e1 b2 s4", "collect e1 b3 s4", "train 4 [2,4)",
      "collect e1 b4 s5", "drop 1",           "save 4"};
  EXPECT_EQ(r.events, expected);
  EXPECT_EQ(r.seeds.size(), 10u) << "every prompt batch samples with its own seed";
  ASSERT_EQ(r.steps.size(), 4u);
  EXPECT_EQ(r.steps[3].progress_done, 5 + 4);
  // Each epoch is a permutation of the prompts: every prompt is collected once an epoch.
  std::multiset<int64_t> every_prompt;
  for (int64_t i = 0; i < kPrompts; ++i) every_prompt.insert(100 + i);
  EXPECT_EQ(r.marks.at(0), every_prompt);
  EXPECT_EQ(r.marks.at(1), every_prompt);
}

TEST_F(PolicyLoopTest, StepsThatSpanEpochsCarryTheirBatchesOverAndStopAfterStepEndsTheRun) {
  RunOptions options;
  options.steps_span_epochs = true;
  const Record all = run("span", options);
  // 10 batches, 2 a step: the third step takes the first epoch's last batch and the second's first.
  ASSERT_EQ(all.steps.size(), 5u);
  EXPECT_EQ(all.steps[2].epoch, 1);
  EXPECT_EQ(all.steps[2].first_batch, 4);
  EXPECT_EQ(all.steps[2].end_batch, 1);
  EXPECT_EQ(std::count(all.events.begin(), all.events.end(), "drop 0") +
                std::count(all.events.begin(), all.events.end(), "drop 1"),
            0);
  options.stop_after_step = 2;
  const Record stopped = run("stopped", options);
  EXPECT_EQ(stopped.steps.size(), 2u);
  EXPECT_EQ(stopped.saved_steps, 2);
}

TEST_F(PolicyLoopTest, AKilledRunResumesAtTheNextBatchWithTheAlgorithmsStateAndEndsAsAnUnbrokenOne) {
  RunOptions options;
  options.checkpoint_interval = 1;
  const Record whole = run("whole", options);
  {
    rlhf::testing::set_crash_after_optimizer_steps(3);
    EXPECT_THROW(run("killed", options), std::exception);
    rlhf::testing::set_crash_after_optimizer_steps(0);
  }
  const Record resumed = run("killed", options);
  ASSERT_TRUE(resumed.restored.has_value());
  EXPECT_EQ(resumed.restored->at("toy_steps").get<int64_t>(), 3);
  EXPECT_EQ(resumed.events.at(1), "start step 3 resumed");
  EXPECT_EQ(resumed.events.at(2), "collect e1 b2 s4") << "the first batch after step 3's";
  EXPECT_EQ(resumed.saved_steps, 4);
  for (const auto& [key, value] : whole.parameters) {
    EXPECT_TRUE(torch::allclose(resumed.parameters.at(key), value, 1e-5, 1e-6)) << key;
  }
}

TEST_F(PolicyLoopTest, ANanLossRollsBackDropsWhatWasCollectedAndSkipsTheStepsBatches) {
  RunOptions options;
  options.nan_at_step = 2;
  const Record r = run("nan", options);
  // Step 2 ([2,4) of epoch 0) is rolled back. A policy step's figures judge the weights of the
  // step before, so step 1's snapshot is not yet trusted: the run returns to the start, then
  // skips step 2's batches: epoch 0 trains [0,2) and keeps batch 4 uncompleted; epoch 1 two steps.
  const auto rollback = std::find(r.events.begin(), r.events.end(), "drop 0");
  ASSERT_NE(rollback, r.events.end()) << "the rollback drops what was collected";
  ASSERT_LT(rollback + 2, r.events.end());
  EXPECT_EQ(*(rollback + 1), "restore 0");
  EXPECT_EQ(*(rollback + 2), "collect e0 b0 s1");
  const std::vector<std::string> after(rollback + 2, r.events.end());
  const std::vector<std::string> expected = {
      "collect e0 b0 s1", "collect e0 b1 s1", "train 1 [0,2)",    "collect e0 b4 s2", "drop 1",
      "collect e1 b0 s2", "collect e1 b1 s2", "train 2 [0,2)",    "collect e1 b2 s3", "collect e1 b3 s3",
      "train 3 [2,4)",    "collect e1 b4 s4", "drop 1",           "save 3"};
  EXPECT_EQ(after, expected) << "batches 2 and 3 of epoch 0 are skipped";
  EXPECT_EQ(r.saved_steps, 3);
}

}  // namespace
}  // namespace dschat
