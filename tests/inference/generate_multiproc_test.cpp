// Lockstep generation across processes: 2 Gloo ranks of tests/inference/generate_worker.cpp
// generate different prompts whose EOS comes at very different lengths (rank 0 after a couple of
// tokens, rank 1 never); the rank that finishes first keeps stepping until the other is done, and
// each rank's ids equal its own single-process generation. A deadlock would hit the job deadline
// (the ranks are killed and the test fails) instead of hanging ctest. The same for the continuous
// engine, whose ranks also run different numbers of forwards within a step (--continuous).
#include <gtest/gtest.h>

#include <fstream>

#include "rank_jobs.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

constexpr int64_t kNewTokens = 12;

std::string worker() { return DSCHAT_GENERATE_WORKER_PATH; }  // set for this file by tests/CMakeLists.txt

testing::JobOutcome run_job(const testing::TempDir& out, std::vector<std::string> extra) {
  testing::JobSpec spec;
  spec.argv = {worker(), "--model", testing::fixture("opt-preln").string(), "--out", out.path().string(),
               "--new-tokens", std::to_string(kNewTokens)};
  spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
  spec.world_size = 2;
  spec.deadline = std::chrono::seconds(90);
  return testing::run_rank_job(spec);
}

json read_report(const testing::TempDir& out, int rank) {
  std::ifstream in(out / ("rank" + std::to_string(rank) + ".json"));
  if (!in) return json::object();
  return json::parse(in);
}

TEST(GenerateMultiproc, RanksFinishingAtDifferentLengthsMatchTheirSingleProcessIds) {
  ASSERT_TRUE(std::filesystem::exists(worker())) << worker();
  testing::TempDir out;
  const testing::JobOutcome job = run_job(out, {});
  ASSERT_FALSE(job.deadline_hit) << "deadlock?\n" << job.describe();
  for (const auto& rank : job.ranks) ASSERT_EQ(rank.exit_code, 0) << job.describe();
  const json r0 = read_report(out, 0), r1 = read_report(out, 1);
  ASSERT_TRUE(r0.contains("equal") && r1.contains("equal")) << job.describe();
  EXPECT_TRUE(r0["equal"].get<bool>());
  EXPECT_TRUE(r1["equal"].get<bool>());
  EXPECT_EQ(r0["eos"], r1["eos"]);
  // Rank 0 stopped early and returned only its own tokens; rank 1 ran every step.
  const int64_t prompt = 10;
  EXPECT_LT(r0["length"].get<int64_t>(), prompt + kNewTokens - 4) << r0.dump();
  EXPECT_EQ(r1["length"].get<int64_t>(), prompt + kNewTokens) << r1.dump();
  // Both ran the same number of forwards (the collectives of ZeRO-3 would need exactly that).
  EXPECT_EQ(r0["forward_steps"].get<int64_t>(), kNewTokens);
  EXPECT_EQ(r1["forward_steps"].get<int64_t>(), kNewTokens);
}

TEST(GenerateMultiproc, MaxNewTokensDifferingAcrossRanksIsAnErrorOnEveryRank) {
  testing::TempDir out;
  const testing::JobOutcome job = run_job(out, {"--mismatch"});
  ASSERT_FALSE(job.deadline_hit) << job.describe();
  for (const auto& rank : job.ranks) {
    EXPECT_EQ(rank.exit_code, 1) << job.describe();
    EXPECT_NE(rank.err.find("max_new_tokens must be the same on every rank, got 12 to 13"), std::string::npos)
        << rank.err;
  }
}

TEST(GenerateMultiproc, OneRankRejectingItsInputStopsTheOthersToo) {
  testing::TempDir out;
  const testing::JobOutcome job = run_job(out, {"--overflow-rank", "1"});
  ASSERT_FALSE(job.deadline_hit) << job.describe();
  ASSERT_EQ(job.ranks.size(), 2u);
  for (const auto& rank : job.ranks) EXPECT_EQ(rank.exit_code, 1) << job.describe();
  EXPECT_NE(job.ranks[1].err.find("exceeds max_out_tokens (10)"), std::string::npos) << job.ranks[1].err;
  EXPECT_NE(job.ranks[0].err.find("another rank rejected its generate call"), std::string::npos) << job.ranks[0].err;
}

// Rank 0 prefills one prompt in its first step, rank 1 two; rank 0 then ends early. Every forward
// all-reduces its index and its layers' (the worker's CollectiveLayerCheck), so a forward one rank
// ran alone would fail the job: the votes give rank 0 the idle forwards that keep it in step.
TEST(GenerateMultiproc, ContinuousRanksWithDifferentForwardCountsStayInStep) {
  testing::TempDir out;
  const testing::JobOutcome job = run_job(out, {"--continuous"});
  ASSERT_FALSE(job.deadline_hit) << "deadlock?\n" << job.describe();
  for (const auto& rank : job.ranks) ASSERT_EQ(rank.exit_code, 0) << job.describe();
  const json r0 = read_report(out, 0), r1 = read_report(out, 1);
  ASSERT_TRUE(r0.contains("equal") && r1.contains("equal")) << job.describe();
  EXPECT_TRUE(r0["equal"].get<bool>());
  EXPECT_TRUE(r1["equal"].get<bool>());
  EXPECT_EQ(r0["forward_steps"], r1["forward_steps"]) << r0.dump() << r1.dump();
  EXPECT_GT(r0["idle_forwards"].get<int64_t>(), 1) << r0.dump();  // step 1 and after its early end
  EXPECT_EQ(r1["idle_forwards"].get<int64_t>(), 0) << r1.dump();
}

TEST(GenerateMultiproc, ContinuousRankRejectingItsInputStopsTheOthersToo) {
  testing::TempDir out;
  const testing::JobOutcome job = run_job(out, {"--continuous", "--overflow-rank", "1"});
  ASSERT_FALSE(job.deadline_hit) << job.describe();
  ASSERT_EQ(job.ranks.size(), 2u);
  for (const auto& rank : job.ranks) EXPECT_EQ(rank.exit_code, 1) << job.describe();
  EXPECT_NE(job.ranks[1].err.find("the pool holds 2"), std::string::npos) << job.ranks[1].err;
  EXPECT_NE(job.ranks[0].err.find("another rank rejected its generate call"), std::string::npos) << job.ranks[0].err;
}

}  // namespace
}  // namespace dschat
