// The guardian's rollback across ranks: two ranks (tests/rlhf/guardian_worker.cpp) train the toy
// guarded run at ZeRO stages 0-3; a NaN gradient in rank 0's batch at optimizer step 9 makes both
// ranks roll back together to the snapshot of step 6 and retry. Every rank must finish all 12
// steps having rolled back once, with the weights of the run that never saw the fault: exactly at
// stage 0 (the same reductions), and within float32 reduction-order noise at stages 1-3 (whose
// partitioned reductions add in another order than stage 0's).
#include <gtest/gtest.h>

#include <fstream>

#include "rank_jobs.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

std::vector<json> run_job(const testing::TempDir& tmp, const std::string& name, int stage, bool fault) {
  testing::JobSpec spec;
  const std::string prefix = (tmp / name).string();
  spec.argv = {std::string(DSCHAT_BUILD_DIR) + "/tests/dschat_guardian_worker", "--out", prefix, "--dir",
               (tmp / (name + "_run")).string(), "--stage", std::to_string(stage), "--timeout-ms", "60000"};
  if (fault) spec.argv.push_back("--fault");
  spec.world_size = 2;
  spec.deadline = std::chrono::seconds(120);
  const testing::JobOutcome job = testing::run_rank_job(spec);
  std::vector<json> reports;
  EXPECT_FALSE(job.deadline_hit) << job.describe();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(job.ranks[r].exit_code, 0) << job.describe();
    std::ifstream in(prefix + ".rank" + std::to_string(r) + ".json");
    reports.push_back(in ? json::parse(in) : json::object());
  }
  return reports;
}

TEST(GuardianMultiproc, TwoRanksRollBackTogetherAtEveryZeroStage) {
  testing::TempDir tmp;
  const std::vector<json> clean = run_job(tmp, "clean", 0, false);
  ASSERT_TRUE(clean[0].contains("parameters"));
  EXPECT_FALSE(clean[0].contains("rollback_to"));
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(stage));
    const std::vector<json> faulty = run_job(tmp, "fault" + std::to_string(stage), stage, true);
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(faulty[r].contains("parameters")) << "rank " << r;
      EXPECT_EQ(faulty[r].at("global_steps"), 12) << "rank " << r;
      EXPECT_EQ(faulty[r].at("stopped"), "") << "rank " << r;
      // Both ranks hold the same weights: they rolled back together.
      EXPECT_EQ(faulty[r].at("parameters"), faulty[0].at("parameters")) << "rank " << r;
    }
    EXPECT_EQ(faulty[0].at("faults"), 1);
    EXPECT_EQ(faulty[0].at("rollback_to"), json::array({6.0}));
    for (const auto& [name, sums] : clean[0].at("parameters").items()) {
      const json& got = faulty[0].at("parameters").at(name);
      for (int i = 0; i < 2; ++i) {
        const double want = sums[i].get<double>(), value = got[i].get<double>();
        if (stage == 0) {
          EXPECT_EQ(value, want) << name;
        } else {
          EXPECT_NEAR(value, want, 1e-4 + 1e-5 * std::abs(want)) << name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dschat
