// The critic-free step's batch-wide statistics span every rank: two ranks, each with its own
// answers at its own answer width (tests/rlhf/critic_free_batches.h), compute the advantages of
// grpo (scale_rewards "batch"), rloo (normalize_advantages, KL penalty) and reinforce_pp (per-token
// KL, global normalisation) with rlhf::compute_advantages (tests/rlhf/critic_free_worker.cpp);
// each rank's rows must equal that rank's rows of one process computing them over both ranks'
// answers together (widths padded to the wider rank's).
#include <gtest/gtest.h>

#include <fstream>

#include "critic_free_batches.h"
#include "rank_jobs.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

TEST(CriticFreeMultiproc, TwoRanksNormaliseOverBothRanksAnswers) {
  testing::TempDir out;
  testing::JobSpec spec;
  const std::string prefix = (out / "advantages").string();
  // (Found in the build tree rather than through a compile definition, which would recompile
  // every test and its PCH.)
  spec.argv = {std::string(DSCHAT_BUILD_DIR) + "/tests/dschat_critic_free_worker", "--out", prefix, "--timeout-ms",
               "30000"};
  spec.world_size = 2;
  const testing::JobOutcome job = testing::run_rank_job(spec);
  ASSERT_FALSE(job.deadline_hit) << job.describe();
  std::vector<json> reports;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(job.ranks[r].exit_code, 0) << job.describe();
    std::ifstream in(prefix + ".rank" + std::to_string(r) + ".json");
    reports.push_back(json::parse(in));
  }
  for (const std::string& estimator : testing::estimators()) {
    SCOPED_TRACE(estimator);
    // Both ranks' answers as one batch, padded to the wider rank's answer width.
    rlhf::CriticFreeBatch both = rlhf::concatenate({testing::rank_answers(0), testing::rank_answers(1)}, 0);
    rlhf::compute_advantages(testing::estimator_config(estimator), testing::source_weights(), both,
                             rlhf::StepContext());
    const torch::Tensor expected = both.advantages.to(torch::kFloat64).reshape({both.exp.rows(), -1});  // [2N, 1 or T]
    bool some_row_differs_from_per_rank = false;
    for (int64_t rank = 0; rank < 2; ++rank) {
      // What this rank would get alone: the statistics of its own answers only.
      rlhf::CriticFreeBatch alone = testing::rank_answers(rank);
      rlhf::compute_advantages(testing::estimator_config(estimator), testing::source_weights(), alone,
                               rlhf::StepContext());
      const torch::Tensor own = alone.advantages.to(torch::kFloat64).reshape({alone.exp.rows(), -1});  // [N, 1 or T_r]
      const json& rows = reports[rank].at(estimator);
      ASSERT_EQ(static_cast<int64_t>(rows.size()), testing::kAnswersPerRank);
      for (int64_t i = 0; i < testing::kAnswersPerRank; ++i) {
        const std::vector<double> got = rows[i].get<std::vector<double>>();
        ASSERT_EQ(static_cast<int64_t>(got.size()), own.size(1)) << "rank " << rank << " keeps its own width";
        for (int64_t t = 0; t < own.size(1); ++t) {
          const double want = expected[rank * testing::kAnswersPerRank + i][t].item<double>();
          EXPECT_NEAR(got[t], want, 1e-5 + 1e-5 * std::abs(want)) << "rank " << rank << " row " << i << " col " << t;
          if (std::abs(own[i][t].item<double>() - want) > 1e-3) some_row_differs_from_per_rank = true;
        }
      }
    }
    // The check has teeth: per-rank statistics would give other values.
    EXPECT_TRUE(some_row_differs_from_per_rank);
  }
}

}  // namespace
}  // namespace dschat
