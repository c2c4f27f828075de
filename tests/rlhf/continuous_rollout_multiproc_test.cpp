// Step 3 (PPO) on 2 ranks at ZeRO-3 with hybrid_engine continuous batching, end to end through
// `dschat launch ... dschat train`: in lockstep across the data-parallel ranks (inference_tp_size
// 1: each rank's forwards gather every layer from both) and as one tensor-parallel group
// (inference_tp_size 2), with prefix caching, it trains exactly the weights the static engine
// trains. Generation is seeded sampling, and the two engines draw the same ids for the same seeds
// (tests/inference/continuous_engine_test.cpp), so the experience, and so every update, is the same;
// a rank out of step would hang (the run's timeout) or fail, and a different draw would change the
// weights. Steps 1 and 2 run once, on one rank, and every variant starts step 3 from their output.
// The runs also keep DeepSpeed-Chat's EMA actor (partitioned at ZeRO-3, engine::PartitionedEma:
// checkpointed after each step and written as actor_ema, both gathered from the 2 ranks), which
// must be the same in every variant too.
#include <gtest/gtest.h>

#include <filesystem>

#include "dschat/io/state_dict.h"
#include "elastic_run.h"
#include "test_util.h"
#include "tiny_pipeline.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json step3_variant(const fs::path& trained, const fs::path& out, int64_t tp, bool continuous) {
  return testing::zero3_step3_config(trained, out,
                                     {{"checkpoint_interval", 1},
                                      {"inference_tp_size", tp},
                                      {"continuous_batching", continuous},
                                      {"prefix_caching", continuous}});
}

TEST(ContinuousRolloutMultiproc, PpoAtZero3TrainsTheStaticEnginesWeightsInLockstepAndInATensorParallelGroup) {
  testing::TempDir dir;
  std::string out;
  const fs::path first_steps = testing::write_tiny_pipeline_config(dir.path());
  for (int step : {1, 2}) {
    ASSERT_EQ(testing::run_train(1, first_steps, step, dir.path(), "step" + std::to_string(step), &out), 0) << out;
  }
  std::map<std::string, io::TensorMap> actors, emas;  // variant -> step 3's actor, its EMA
  for (int64_t tp : {1, 2}) {
    for (bool continuous : {false, true}) {
      const std::string name = std::string(continuous ? "continuous" : "static") + "_tp" + std::to_string(tp);
      const fs::path variant = dir / name;
      fs::create_directories(variant);
      const fs::path config =
          testing::write_tiny_pipeline_config(variant, step3_variant(dir / "out", variant / "out", tp, continuous));
      ASSERT_EQ(testing::run_train(2, config, 3, variant, name, &out), 0) << name << "\n" << out;
      actors[name] = io::load_state_dict(variant / "out/step3/actor");
      emas[name] = io::load_state_dict(variant / "out/step3/actor_ema");
    }
  }
  for (const char* tp : {"_tp1", "_tp2"}) {
    const io::TensorMap& reference = actors.at(std::string("static") + tp);
    const io::TensorMap& got = actors.at(std::string("continuous") + tp);
    ASSERT_EQ(got.size(), reference.size()) << tp;
    for (const auto& [name, tensor] : reference) EXPECT_TRUE(torch::equal(got.at(name), tensor)) << tp << " " << name;
    const io::TensorMap& reference_ema = emas.at(std::string("static") + tp);
    const io::TensorMap& got_ema = emas.at(std::string("continuous") + tp);
    ASSERT_EQ(got_ema.size(), reference.size()) << tp;
    bool moved = false;  // the average is not the actor: the EMA was averaged, not copied
    for (const auto& [name, tensor] : reference_ema) {
      EXPECT_TRUE(torch::equal(got_ema.at(name), tensor)) << tp << " EMA " << name;
      moved = moved || !torch::equal(tensor, reference.at(name));
    }
    EXPECT_TRUE(moved) << tp;
  }
}

}  // namespace
}  // namespace dschat
