// HybridEngine across processes (Gloo): ZeRO-3 gathered generation (pinned, and layer by layer in
// lockstep) and tensor-parallel generation, with the static or the continuous engine, give the ids
// a plain single-process generation gives;
// ranks whose prompts stop at different lengths all finish; after a training step, every way of
// generating agrees with stage 0. The ranks are tests/hybrid/hybrid_worker.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "rank_jobs.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

struct Run {
  std::string name;
  int world = 2;
  std::vector<std::string> flags;
};

// Every rank's report, in rank order (empty on failure, with the job's output in the message).
std::vector<json> run_hybrid(const Run& run) {
  testing::TempDir out;
  testing::JobSpec spec;
  const std::string prefix = (out / "report").string();
  spec.argv = {DSCHAT_HYBRID_WORKER_PATH, "--out", prefix, "--timeout-ms", "30000"};
  spec.argv.insert(spec.argv.end(), run.flags.begin(), run.flags.end());
  spec.world_size = run.world;
  spec.deadline = std::chrono::seconds(90);  // a deadlock fails here instead of hanging
  const testing::JobOutcome job = testing::run_rank_job(spec);
  EXPECT_FALSE(job.deadline_hit) << run.name << "\n" << job.describe();
  std::vector<json> reports;
  for (int r = 0; r < run.world; ++r) {
    EXPECT_EQ(job.ranks[r].exit_code, 0) << run.name << "\n" << job.describe();
    std::ifstream in(prefix + ".rank" + std::to_string(r) + ".json");
    if (!in) return {};
    reports.push_back(json::parse(in));
  }
  return reports;
}

const std::vector<json>& stage0_reference(int world = 2) {
  static const std::vector<json> two = run_hybrid({"stage 0", 2, {"--stage", "0", "--uneven"}});
  if (world == 2) return two;
  static const std::vector<json> four = run_hybrid({"stage 0 on 4 ranks", 4, {"--stage", "0", "--uneven"}});
  return four;
}

void expect_like_reference(const Run& run, bool compare_after_step = true) {
  const std::vector<json> reports = run_hybrid(run);
  ASSERT_EQ(reports.size(), static_cast<size_t>(run.world)) << run.name;
  const auto& reference = stage0_reference(run.world);
  ASSERT_EQ(reference.size(), static_cast<size_t>(run.world));
  for (int r = 0; r < run.world; ++r) {
    const json& report = reports[r];
    EXPECT_TRUE(report["first_matches"].get<bool>()) << run.name << " rank " << r << ": " << report.dump();
    if (report.contains("tp_sampling_agrees")) {
      EXPECT_TRUE(report["tp_sampling_agrees"].get<bool>()) << run.name << " rank " << r << ": " << report.dump();
    }
    if (report.contains("eos_matches")) {
      EXPECT_TRUE(report["eos_matches"].get<bool>()) << run.name << " rank " << r << ": " << report.dump();
    }
    if (report.contains("shared_matches")) {
      EXPECT_TRUE(report["shared_matches"].get<bool>()) << run.name << " rank " << r << ": " << report.dump();
      // Every prompt after the first of the batch generated together (2 per rank; the TP group's
      // joint batch of 2 * tp) takes the shared prefix's one full 16-token block from the cache.
      const auto tp_flag = std::find(run.flags.begin(), run.flags.end(), "--tp");
      const int64_t tp = tp_flag == run.flags.end() ? 1 : std::stoll(*(tp_flag + 1));
      EXPECT_EQ(report["shared_cached_tokens"].get<int64_t>(), 16 * (2 * tp - 1)) << run.name;
    }
    EXPECT_EQ(report["inference_bytes_after_train"].get<int64_t>(), 0) << run.name;
    if (compare_after_step) {
      EXPECT_EQ(report["after_step"], reference[r]["after_step"]) << run.name << " rank " << r;
    }
  }
}

TEST(HybridMultiproc, Stage0DataParallelWithUnevenEosFinishes) {
  const auto& reports = stage0_reference();
  ASSERT_EQ(reports.size(), 2u);
  for (const json& report : reports) {
    EXPECT_TRUE(report["first_matches"].get<bool>()) << report.dump();
    EXPECT_TRUE(report["eos_matches"].get<bool>()) << report.dump();
    EXPECT_GE(report["self_check_max_diff"].get<double>(), 0.0);
  }
  // Rank 0's first row stops after 2 tokens (its EOS was chosen so) while some row of the job
  // runs longer: the ranks' rows finish at different steps, and nobody hung.
  const int64_t eos = reports[0]["eos_token"].get<int64_t>();
  EXPECT_EQ(reports[0]["eos"][0][5 + 1].get<int64_t>(), eos) << reports[0]["eos"];
  const int64_t longest =
      std::max(reports[0]["eos_new_tokens"].get<int64_t>(), reports[1]["eos_new_tokens"].get<int64_t>());
  EXPECT_GT(longest, 2) << reports[0]["eos"] << reports[1]["eos"];
}

TEST(HybridMultiproc, Stage3PinnedGenerationEqualsStage0) {
  expect_like_reference({"stage 3 pinned", 2, {"--stage", "3", "--pin", "1", "--uneven"}});
}

TEST(HybridMultiproc, Stage3LayerByLayerGenerationInLockstepEqualsStage0) {
  expect_like_reference({"stage 3 unpinned", 2, {"--stage", "3", "--pin", "0", "--uneven"}});
}

TEST(HybridMultiproc, Stage3UnpinnedWithLoraFusesPerLayer) {
  expect_like_reference({"stage 3 unpinned lora", 2, {"--stage", "3", "--pin", "0", "--lora"}}, false);
}

// The continuous engine with prefix caching: data-parallel ranks under ZeRO-3 gather each layer
// on every forward, so their forwards pair up by vote (idle ones for the rank that ended first).
TEST(HybridMultiproc, Stage3LayerByLayerContinuousBatchingInLockstepEqualsStage0) {
  expect_like_reference({"stage 3 unpinned continuous", 2, {"--stage", "3", "--pin", "0", "--uneven", "--continuous"}});
}

// A TP group runs one continuous schedule over the joint batch, each rank on its shard's blocks.
TEST(HybridMultiproc, TensorParallelContinuousBatchingEqualsSingleProcess) {
  expect_like_reference({"tp 2 continuous", 2, {"--stage", "0", "--tp", "2", "--uneven", "--continuous"}});
}

TEST(HybridMultiproc, TensorParallelFromStage3GroupsWithContinuousBatching) {
  expect_like_reference(
      {"tp 2 stage 3 continuous", 2, {"--stage", "3", "--tp", "2", "--pin", "0", "--gather", "1", "--continuous"}});
}

TEST(HybridMultiproc, TensorParallelViewsEqualSingleProcess) {
  expect_like_reference({"tp 2 stage 0", 2, {"--stage", "0", "--tp", "2", "--uneven"}});
}

TEST(HybridMultiproc, TensorParallelFromStage3GroupsEqualsSingleProcess) {
  expect_like_reference({"tp 2 stage 3 groups of 1", 2, {"--stage", "3", "--tp", "2", "--pin", "0", "--gather", "1"}});
}

// inference_tp_size 2 on 4 ranks: two groups of 2 ({0, 1}, {2, 3}) generate their own joint
// batches at the same time; each rank's ids are those of its prompts alone, before and after a
// training step, as with inference_tp_size 1 on the same 4 ranks.
TEST(HybridMultiproc, TensorParallelGroupsOfTwoOnFourRanksAtStage2) {
  expect_like_reference({"tp 2 of 4 stage 2", 4, {"--stage", "2", "--tp", "2", "--uneven"}});
}

TEST(HybridMultiproc, TensorParallelGroupsOfTwoOnFourRanksAtStage3WithContinuousBatching) {
  expect_like_reference(
      {"tp 2 of 4 stage 3 continuous", 4, {"--stage", "3", "--tp", "2", "--pin", "0", "--gather", "2", "--continuous"}});
}

TEST(HybridMultiproc, TensorParallelBf16CastWithLora) {
  expect_like_reference({"tp 2 bf16 lora", 2, {"--stage", "2", "--tp", "2", "--bf16-generation", "--lora"}}, false);
}

}  // namespace
}  // namespace dschat
