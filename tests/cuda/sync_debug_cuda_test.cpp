// The training loops on the GPU make no host round trip that is not marked and allowed: one SFT
// step, one reward step and one full PPO iteration (generation included) run under LibTorch's
// CUDA sync-debug mode set to "error", so any synchronising call outside a core::HostSync scope
// throws. The marked ones are checked against the allow-list below, which says why each is
// needed. Skips without a GPU.
#include <gtest/gtest.h>

#include <map>

#include "cuda/cuda_cases.h"
#include "dschat/core/host_sync.h"
#include "dschat/rlhf/trainers/pipeline.h"
#include "test_util.h"
#include "tiny_pipeline.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;

// name -> why the loop needs it.
const std::map<std::string, std::string> kAllowedSyncs = {
    {"step setup (models, engines, data)", "loading copies host tensors in; once per step, before the loop"},
    {"step end (evaluation, save)", "the trained model is written to disk; once per step, after the loop"},
    {"evaluation (perplexity / reward accuracy)", "one read of the accumulated sums per evaluation"},
    {"statistics (every print_interval)", "the progress line and metrics log are host text"},
    {"optimizer step (gradient norm, overflow)", "skipping an fp16 overflow step is a host decision"},
    {"optimizer offload (host waits for its gradient copies)", "the CPU optimizer reads the gradients it steps"},
    {"generation (all rows finished?)", "the decode loop stops when every row has ended (every 8 steps on a GPU)"},
    {"generation (prompt padding, once per call)", "unpadded prompts take SDPA's causal prefill, as before"},
    {"experience (answer filter)", "dropping short answers changes the batch's row count"},
    {"checkpoint", "a resumable checkpoint is written to disk"},
    {"experience (padding layout, once per batch and scorer)",
     "an unpadded batch takes SDPA's causal path in the four scoring forwards and the training ones"},
    {"statistics (print_loss: every micro-step, on request)", "DS-Chat's per-micro-step loss line, when asked"},
    {"statistics (print_answers, on request)", "the sampled answers are printed as text, when asked"},
    {"generation (logits self-check, first call after a switch; debug builds)",
     "compares the inference path with the training forward once per switch"},
};

TEST(SyncDebugCuda, OneStepOfEachTrainerMakesOnlyAllowedSyncs) {
  DSCHAT_REQUIRE_CUDA();
  testing::TempDir tmp;
  const fs::path model = testing::source_dir() / "assets" / "demo-opt";
  nlohmann::json json = rlhf::demo_config();
  // One optimizer step each: batches as large as the phase's data.
  json.merge_patch(testing::tiny_pipeline_json(
      tmp.path(), {{"preset", nullptr},
                   {"actor_model", model.string()},
                   {"reward_model", model.string()},
                   {"tokenizer", model.string()},
                   {"device", "cuda"},
                   {"step1", {{"per_device_train_batch_size", 64}}},
                   {"step2", {{"per_device_train_batch_size", 64}}},
                   {"step3", {{"per_device_generation_batch_size", 64}, {"per_device_training_batch_size", 64}}}}));
  const rlhf::PipelineConfig config = rlhf::parse_pipeline_config(json, "sync-debug test");
  rlhf::StepContext context;
  context.random_init = true;
  context.tokenizer_dir = model.string();
  context.progress = false;

  core::reset_host_sync_counts();
  core::set_sync_debug_mode(2);  // error on every unmarked synchronising call
  rlhf::PipelineResult result;
  try {
    result = rlhf::run_pipeline(config, context);
  } catch (const std::exception& e) {
    core::set_sync_debug_mode(0);
    FAIL() << "a synchronising call outside a core::HostSync scope (or another error): " << e.what();
  }
  core::set_sync_debug_mode(0);
  for (const char* step : {"step1", "step2", "step3"}) EXPECT_TRUE(result.summaries.contains(step)) << step;
  const std::map<std::string, int64_t> counts = core::host_sync_counts();
  for (const auto& [name, count] : counts) {
    EXPECT_TRUE(kAllowedSyncs.count(name)) << "host sync '" << name << "' (" << count << "x) is not in the allow-list";
  }
  // The per-step reads happen once per optimizer step at most (three trained models, a handful of
  // steps), not once per micro-step or token.
  auto count_of = [&](const std::string& name) { return counts.count(name) ? counts.at(name) : 0; };
  EXPECT_LE(count_of("optimizer step (gradient norm, overflow)"), 8);
  EXPECT_GE(count_of("optimizer step (gradient norm, overflow)"), 3);  // SFT, RM, actor + critic
}

}  // namespace
}  // namespace dschat
