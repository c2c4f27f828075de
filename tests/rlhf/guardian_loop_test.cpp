// The guardian acting in the supervised loop (the loop of SFT, the reward model and DPO), one
// process: each test injects a fault into tests/rlhf/guardian_toy_run.h's run and checks the
// event, the rollback to the right snapshot, and the end state against a run that never saw the
// fault. 3 epochs of 6 micro-batches, one micro-batch an optimizer step: steps 1-18, snapshots
// every 3 steps (and at step 0).
#include <gtest/gtest.h>

#include <filesystem>

#include "guardian_toy_run.h"
#include "test_util.h"

namespace dschat {
namespace {

using monitor::GuardianAction;
using testing::ToyRunOptions;
using testing::ToyRunResult;

void expect_same_parameters(const ToyRunResult& a, const ToyRunResult& b) {
  ASSERT_EQ(a.parameters.size(), b.parameters.size());
  for (const auto& [name, value] : a.parameters) {
    ASSERT_TRUE(b.parameters.count(name)) << name;
    EXPECT_TRUE(torch::isfinite(value).all().item<bool>()) << name;
    EXPECT_TRUE(torch::equal(value, b.parameters.at(name))) << name << " differs";
  }
}

double value_of(const monitor::MetricsRow& row, const std::string& key) {
  auto it = row.values.find(key);
  return it == row.values.end() ? std::nan("") : it->second;
}

TEST(GuardianLoop, ANanGradientRollsBackAndTheRetriedRunEqualsACleanOne) {
  testing::TempDir tmp;
  ToyRunOptions clean;
  clean.dir = tmp / "clean";
  clean.guardian = testing::exact_rollback_guardian("retry");
  const ToyRunResult reference = run_toy_guarded(clean);
  EXPECT_EQ(reference.global_steps, 18);
  EXPECT_TRUE(testing::guardian_rows(clean.dir).empty()) << "a clean run has no guardian events";

  ToyRunOptions faulty = clean;
  faulty.dir = tmp / "faulty";
  faulty.fault = {"nan_grad", /*epoch=*/1, /*batch=*/2};  // optimizer step 9
  const ToyRunResult r = run_toy_guarded(faulty);
  EXPECT_EQ(r.faults_fired, 1);
  EXPECT_TRUE(r.stopped.empty()) << r.stopped;
  EXPECT_EQ(r.global_steps, 18);
  expect_same_parameters(r, reference);

  const std::vector<monitor::MetricsRow> rows = testing::guardian_rows(faulty.dir);
  ASSERT_EQ(rows.size(), 2u);  // the event, then the rollback
  EXPECT_EQ(rows[0].step, 9);
  EXPECT_EQ(value_of(rows[0], "non_finite"), -1.0);  // the gradient norm the engine reports
  EXPECT_EQ(value_of(rows[0], "non_finite_action"), static_cast<double>(GuardianAction::kRollback));
  EXPECT_EQ(rows[1].step, 9);
  EXPECT_EQ(value_of(rows[1], "rollback_to"), 6.0);  // the last snapshot before step 9
  EXPECT_EQ(value_of(rows[1], "rollbacks"), 1.0);
  EXPECT_FALSE(std::filesystem::exists(tmp / "faulty_guardian")) << "snapshots are removed at the end";
}

TEST(GuardianLoop, ALossSpikeBatchIsSkippedAndTheRunEqualsOneWithoutIt) {
  testing::TempDir tmp;
  ToyRunOptions without;
  without.dir = tmp / "without";
  without.guardian = testing::exact_rollback_guardian("skip");
  without.omit = {{1, 3}};  // the spiking batch never exists
  const ToyRunResult reference = run_toy_guarded(without);
  EXPECT_EQ(reference.global_steps, 17);

  ToyRunOptions faulty = without;
  faulty.dir = tmp / "faulty";
  faulty.omit.clear();
  faulty.fault = {"spike", 1, 3, /*once=*/false};  // every time it trains: only skipping it helps
  const ToyRunResult r = run_toy_guarded(faulty);
  EXPECT_EQ(r.faults_fired, 1);
  EXPECT_TRUE(r.stopped.empty()) << r.stopped;
  EXPECT_EQ(r.global_steps, 17);
  expect_same_parameters(r, reference);
  const std::vector<monitor::MetricsRow> rows = testing::guardian_rows(faulty.dir);
  ASSERT_GE(rows.size(), 2u);
  EXPECT_EQ(rows[0].step, 10);
  EXPECT_GT(value_of(rows[0], "loss_spike"), 20.0);  // the loss x 50 (about 6 x 50)
  EXPECT_EQ(value_of(rows[0], "loss_spike_limit"), 5.0);
  EXPECT_EQ(value_of(rows[1], "rollback_to"), 9.0);
}

TEST(GuardianLoop, LoweredLearningRateAndReseedChangeTheContinuation) {
  testing::TempDir tmp;
  ToyRunOptions faulty;
  faulty.dir = tmp / "faulty";
  faulty.guardian = testing::exact_rollback_guardian("retry");
  faulty.guardian.lr_factor = 0.5;
  faulty.fault = {"nan_grad", 1, 2};
  const ToyRunResult r = run_toy_guarded(faulty);
  ToyRunOptions clean = faulty;
  clean.dir = tmp / "clean";
  clean.fault = {};
  const ToyRunResult reference = run_toy_guarded(clean);
  const std::vector<monitor::MetricsRow> rows = testing::guardian_rows(faulty.dir);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(value_of(rows[1], "lr_multiplier"), 0.5);
  bool differs = false;
  for (const auto& [name, value] : r.parameters) {
    EXPECT_TRUE(torch::isfinite(value).all().item<bool>()) << name;
    differs = differs || !torch::equal(value, reference.parameters.at(name));
  }
  EXPECT_TRUE(differs) << "a halved learning rate after step 6 must change the weights";
}

TEST(GuardianLoop, StopActionSavesACheckpointAndThrows) {
  testing::TempDir tmp;
  ToyRunOptions o;
  o.dir = tmp / "stop";
  o.guardian = testing::exact_rollback_guardian("skip");
  o.guardian.non_finite.action = GuardianAction::kStop;
  o.fault = {"nan_grad", 0, 4};  // step 5
  const ToyRunResult r = run_toy_guarded(o);
  EXPECT_NE(r.stopped.find("stopped the run at optimizer step 5"), std::string::npos) << r.stopped;
  EXPECT_NE(r.stopped.find("non_finite"), std::string::npos) << r.stopped;
  EXPECT_EQ(r.global_steps, 5);
  EXPECT_TRUE(std::filesystem::exists(tmp / "stop_checkpoints" / "latest"));
  for (const auto& [name, value] : r.parameters) EXPECT_TRUE(torch::isfinite(value).all().item<bool>()) << name;
}

TEST(GuardianLoop, ARecurringFaultExhaustsTheRollbacksThenStops) {
  testing::TempDir tmp;
  ToyRunOptions o;
  o.dir = tmp / "recurring";
  o.guardian = testing::exact_rollback_guardian("retry");
  o.guardian.max_rollbacks = 2;
  o.fault = {"nan_grad", 0, 4, /*once=*/false};  // step 5, every time: retrying cannot help
  const ToyRunResult r = run_toy_guarded(o);
  EXPECT_EQ(r.faults_fired, 3);
  EXPECT_NE(r.stopped.find("no rollback is left"), std::string::npos) << r.stopped;
  int rollbacks = 0;
  for (const monitor::MetricsRow& row : testing::guardian_rows(o.dir)) rollbacks += row.values.count("rollback_to");
  EXPECT_EQ(rollbacks, 2);
}

TEST(GuardianLoop, WarnOnlyLogsAndTrainsOn) {
  testing::TempDir tmp;
  ToyRunOptions o;
  o.dir = tmp / "warn";
  o.guardian = testing::exact_rollback_guardian("skip");
  o.guardian.loss_spike.action = GuardianAction::kWarn;
  o.fault = {"spike", 1, 3};
  const ToyRunResult r = run_toy_guarded(o);
  EXPECT_TRUE(r.stopped.empty());
  EXPECT_EQ(r.global_steps, 18);
  const std::vector<monitor::MetricsRow> rows = testing::guardian_rows(o.dir);
  ASSERT_GE(rows.size(), 1u);
  EXPECT_EQ(rows[0].step, 10);
  for (const monitor::MetricsRow& row : rows) EXPECT_EQ(row.values.count("rollback_to"), 0u);
  EXPECT_EQ(value_of(rows[0], "loss_spike_action"), static_cast<double>(GuardianAction::kWarn));
}

}  // namespace
}  // namespace dschat
