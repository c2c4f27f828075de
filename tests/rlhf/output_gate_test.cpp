// The gate before a step's final save (rlhf/setup/output_gate.h): a diverged model (NaN/Inf weights)
// or an untrained one (no optimizer update) fails the step, non-zero exit, nothing saved as
// finished; the staging directory of a failed save is removed; sequence lengths beyond a learned
// position table are refused before training.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>

#include "dschat/rlhf/setup/output_gate.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "test_util.h"
#include "tiny_pipeline.h"

namespace dschat {
namespace {
namespace fs = std::filesystem;

TEST(OutputGate, RefusesNonFiniteOrUntrainedWeightsAndNamesThem) {
  std::map<std::string, torch::Tensor> params = {{"a.weight", torch::ones({2, 2})},           // [2, 2]
                                                 {"b.bias", torch::tensor({1.0f, NAN, INFINITY})},  // [3]
                                                 {"ids", torch::arange(3)}};                   // [3] int64
  EXPECT_EQ(rlhf::non_finite_weights(params), "2 of 10 weights are NaN or Inf (in b.bias)");
  rlhf::StepContext context;
  testing::TempDir dir;
  EXPECT_THROW_WITH(rlhf::check_step_output(params, 5, dir / "actor", context), rlhf::StepFailed,
                    "the training diverged: 2 of 10 weights are NaN or Inf (in b.bias) after 5 optimizer updates");
  params["b.bias"] = torch::zeros({3});  // [3]
  EXPECT_EQ(rlhf::non_finite_weights(params), "");
  EXPECT_NO_THROW(rlhf::check_step_output(params, 5, dir / "actor", context));
  EXPECT_THROW_WITH(rlhf::check_step_output(params, 0, dir / "actor", context), rlhf::StepFailed,
                    "the step made no optimizer update");
}

TEST(OutputGate, AFailedSaveLeavesNoStagingDirectory) {
  testing::TempDir dir;
  const fs::path staging = rlhf::staging_dir_for(dir / "actor");
  EXPECT_THROW(rlhf::write_staged(staging,
                                  [&] {
                                    fs::create_directories(staging / "half");
                                    throw std::runtime_error("No space left on device");
                                  }),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(staging));
  EXPECT_FALSE(fs::exists(dir / "actor"));
}

std::string train(const fs::path& dir, const nlohmann::json& step1, int* status, const std::string& flags = "") {
  const fs::path config = testing::write_tiny_pipeline_config(dir, {{"step1", step1}});
  std::string out;
  *status = testing::run_command(std::string(DSCHAT_CLI_PATH) + " train --config " + config.string() +
                                     " --step 1 --no-progress " + flags,
                                 &out);
  return out;
}

void expect_nothing_finished(const fs::path& dir, const std::string& out) {
  EXPECT_FALSE(fs::exists(dir / "out/actor")) << out;
  for (const auto& entry : fs::directory_iterator(dir / "out")) {
    EXPECT_EQ(entry.path().filename().string().find("actor.saving"), std::string::npos) << entry.path();
  }
}

// learning_rate 1e308 with the guardian off: every weight overflows; the step fails at the gate.
TEST(OutputGate, ADivergedSftRunExitsNonZeroAndSavesNothing) {
  testing::TempDir dir;
  int status = 0;
  const std::string out = train(dir.path(), {{"learning_rate", 1e308}, {"guardian", {{"enabled", false}}}}, &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("the model is not saved and the step is not marked finished: the training diverged"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("actor_checkpoints"), std::string::npos) << out;
  expect_nothing_finished(dir.path(), out);
}

// The same learning rate with the guardian on (its default non_finite rollback): the weights are
// checked after each update, so the overflow is caught at step 1, where it happened, not at the
// next step's NaN loss; every retry overflows again, the rollbacks run out and the run stops.
TEST(OutputGate, TheGuardianCatchesOverflowingWeightsAtTheUpdateThatMadeThem) {
  testing::TempDir dir;
  int status = 0;
  const std::string out = train(dir.path(), {{"learning_rate", 1e308}}, &status);
  EXPECT_EQ(status, 3) << out;
  EXPECT_NE(out.find("weights are NaN or Inf after the update"), std::string::npos) << out;
  EXPECT_EQ(out.find("the loss is not finite"), std::string::npos) << "caught only at the next step's loss\n" << out;
  expect_nothing_finished(dir.path(), out);
}

// max_seq_len 2 leaves no label token after the shift: every loss is NaN. The guardian (on by
// default) rolls back until none is left, then stops the run: exit 3, nothing saved as finished.
// (A step with no update at all is refused by the gate: RefusesNonFiniteOrUntrainedWeights...)
TEST(OutputGate, AnAllNanSftRunExitsNonZeroAndSavesNothing) {
  testing::TempDir dir;
  int status = 0;
  const std::string out = train(dir.path(), {{"max_seq_len", 2}}, &status);
  EXPECT_EQ(status, 3) << out;
  EXPECT_NE(out.find("the guardian stopped the run"), std::string::npos) << out;
  expect_nothing_finished(dir.path(), out);
}

// The same with the guardian off: every loss is NaN, so the step fails before its save however
// the updates went (its gradients can stay finite: nothing but weight decay moves the weights).
TEST(OutputGate, AnAllNanSftRunWithTheGuardianOffFailsTheStep) {
  testing::TempDir dir;
  int status = 0;
  const std::string out = train(dir.path(), {{"max_seq_len", 2}, {"guardian", {{"enabled", false}}}}, &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("the model is not saved and the step is not marked finished: the loss of every one of the"),
            std::string::npos)
      << out;
  expect_nothing_finished(dir.path(), out);
}

TEST(OutputGate, MaxSeqLenBeyondLearnedPositionsIsRefusedByName) {
  testing::TempDir dir;
  int status = 0;
  // --skip-plan: the memory plan would refuse such a length first, for its activations.
  const std::string out = train(dir.path(), {{"max_seq_len", 100000}}, &status, "--skip-plan");
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("step 1 (SFT): key 'max_seq_len' is 100000 tokens, but"), std::string::npos) << out;
  EXPECT_NE(out.find("learned position table of"), std::string::npos) << out;
}

}  // namespace
}  // namespace dschat
