// GRPO, RLOO and REINFORCE++ math (rlhf/math/critic_free.h) against tests/fixtures/rl/critic_free.json,
// written by tools/make_rl_fixtures.py from Python transcriptions of TRL's GRPOTrainer and
// RLOOTrainer (f2cd5771) and OpenRLHF's experience maker (3c3be623): advantages under every
// scaling/aggregation/estimator, with unscorable rows, groups of equal rewards and groups with a
// single scorable row; losses (every reduction, KL, DAPO's asymmetric clip, GSPO's sequence
// ratio) with their gradients and clip fractions. float64 on both sides: tolerance 1e-9 abs unless
// stated.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "dschat/core/error.h"
#include "dschat/rlhf/math/critic_free.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

const json& fixture() {
  static const json data = json::parse(std::ifstream(testing::fixture("rl") / "critic_free.json"));
  return data;
}

// A JSON array of numbers (nested for 2-D; null for NaN) as a float64 tensor.
torch::Tensor tensor_of(const json& values) {
  if (values.empty() || !values[0].is_array()) {
    std::vector<double> flat;
    for (const json& v : values) flat.push_back(v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>());
    return torch::tensor(flat, torch::kDouble);  // [n]
  }
  std::vector<torch::Tensor> rows;
  for (const json& row : values) rows.push_back(tensor_of(row));
  return torch::stack(rows);  // [rows, n]
}

void expect_close(const torch::Tensor& got, const json& want, const std::string& what, double tol = 1e-9) {
  const torch::Tensor expected = tensor_of(want);
  ASSERT_EQ(got.sizes(), expected.sizes()) << what;
  EXPECT_LE(testing::max_abs_diff(got.to(torch::kDouble), expected), tol) << what;
}

TEST(CriticFree, GrpoAdvantagesMatchTrl) {
  const json& f = fixture()["grpo_advantages"];
  const torch::Tensor rewards = tensor_of(f["rewards_per_func"]), weights = tensor_of(f["weights"]);
  const std::map<std::string, rlhf::RewardScaling> scalings = {
      {"group", rlhf::RewardScaling::kGroup}, {"batch", rlhf::RewardScaling::kBatch}, {"none", rlhf::RewardScaling::kNone}};
  for (const json& c : f["cases"]) {
    const auto aggregation = c["aggregation"] == "sum_then_normalize" ? rlhf::RewardAggregation::kSumThenNormalize
                                                                      : rlhf::RewardAggregation::kNormalizeThenSum;
    const torch::Tensor got = rlhf::grpo_advantages(rewards, weights, f["group_size"].get<int64_t>(),
                                                    scalings.at(c["scale_rewards"].get<std::string>()), aggregation);
    // 1e-7: TRL's nanstd computes its Bessel factor count / (count - 1) from integer tensors, so in
    // the default float32 even for these float64 rewards; dschat computes it in the rewards' dtype.
    expect_close(got, c["advantages"], c["scale_rewards"].get<std::string>() + " " + c["aggregation"].get<std::string>(),
                 1e-7);
  }
  // Equal rewards in a group: exactly 0; an unscorable row: 0.
  const torch::Tensor a = rlhf::grpo_advantages(rewards, weights, 4, rlhf::RewardScaling::kGroup);
  for (int64_t i : {4, 5, 6, 7, 9}) EXPECT_EQ(a[i].item<double>(), 0.0) << i;
  EXPECT_THROW_WITH(rlhf::grpo_advantages(rewards, weights, 5, rlhf::RewardScaling::kGroup), core::InvalidArgument,
                    "whole groups of 5");
}

rlhf::GrpoLossOptions options_of(const json& o) {
  rlhf::GrpoLossOptions options;
  options.epsilon_low = o["epsilon_low"].get<double>();
  options.epsilon_high = o["epsilon_high"].get<double>();
  options.beta = o["beta"].get<double>();
  const std::string type = o["type"].get<std::string>();
  options.type = type == "grpo"      ? rlhf::GrpoLossType::kGrpo
                 : type == "bnpo"    ? rlhf::GrpoLossType::kBnpo
                 : type == "dr_grpo" ? rlhf::GrpoLossType::kDrGrpo
                                     : rlhf::GrpoLossType::kDapo;
  options.sequence_level = o["sequence_level"].get<bool>();
  options.max_completion_length = o["max_completion_length"].get<int64_t>();
  options.num_items_in_batch = o["num_items_in_batch"].get<double>();
  options.num_processes = o["num_processes"].get<int64_t>();
  options.gradient_accumulation_steps = o["gradient_accumulation_steps"].get<int64_t>();
  return options;
}

TEST(CriticFree, GrpoLossAndGradientsMatchTrl) {
  const json& f = fixture()["grpo_loss"];
  const torch::Tensor old = tensor_of(f["old_logps"]), ref = tensor_of(f["ref_logps"]), mask = tensor_of(f["mask"]);
  const torch::Tensor advantages = tensor_of(f["advantages"]);
  for (const json& c : f["cases"]) {
    const std::string what = c["options"].dump();
    torch::Tensor logps = tensor_of(f["logps"]).requires_grad_(true);  // [B, T]
    const rlhf::PolicyLossOutput out =
        rlhf::grpo_policy_loss(logps, c["options"]["use_old"].get<bool>() ? old : torch::Tensor(), ref, mask,
                               advantages, options_of(c["options"]));
    EXPECT_NEAR(out.loss.item<double>(), c["loss"].get<double>(), 1e-9) << what;
    EXPECT_NEAR(out.clip_fraction.item<double>(), c["clip_fraction"].get<double>(), 1e-12) << what;
    out.loss.backward();
    expect_close(logps.grad(), c["grad"], what + " gradient");
  }
  EXPECT_THROW_WITH(rlhf::grpo_policy_loss(tensor_of(f["logps"]), old, torch::Tensor(), mask, advantages,
                                           [] {
                                             rlhf::GrpoLossOptions o;
                                             o.beta = 0.1;
                                             return o;
                                           }()),
                    core::InvalidArgument, "needs reference log-probs");
}

TEST(CriticFree, RlooAdvantagesAndLossMatchTrl) {
  const json& f = fixture()["rloo_advantages"];
  const torch::Tensor rewards = tensor_of(f["rewards_per_func"]), weights = tensor_of(f["weights"]);
  const torch::Tensor kl_sums = tensor_of(f["kl_sums"]);
  for (const json& c : f["cases"]) {
    const double clip_low = c["clip"].is_null() ? 0.0 : c["clip"][0].get<double>();
    const double clip_high = c["clip"].is_null() ? 0.0 : c["clip"][1].get<double>();
    const torch::Tensor got = rlhf::rloo_advantages(rewards, weights, f["group_size"].get<int64_t>(),
                                                    c["beta"].get<double>(), kl_sums, c["normalize"].get<bool>(),
                                                    clip_low, clip_high);
    expect_close(got, c["advantages"], c.dump());
  }
  const json& g = fixture()["grpo_loss"];
  const json& l = fixture()["rloo_loss"];
  torch::Tensor logps = tensor_of(g["logps"]).requires_grad_(true);
  const rlhf::PolicyLossOutput out = rlhf::rloo_policy_loss(logps, tensor_of(g["old_logps"]), tensor_of(g["mask"]),
                                                            tensor_of(g["advantages"]), 0.2, 0.2);
  EXPECT_NEAR(out.loss.item<double>(), l["loss"].get<double>(), 1e-9);
  EXPECT_NEAR(out.clip_fraction.item<double>(), l["clip_fraction"].get<double>(), 1e-12);
  out.loss.backward();
  expect_close(logps.grad(), l["grad"], "rloo gradient");
}

TEST(CriticFree, ReinforcePlusPlusMatchesOpenRlhf) {
  const json& k = fixture()["approx_kl"];
  const torch::Tensor lp = tensor_of(k["logps"]), lb = tensor_of(k["ref_logps"]);
  // fp32 as upstream computes it: compared at float precision.
  expect_close(rlhf::approx_kl(lp, lb, rlhf::KlEstimator::kK1), k["k1"], "k1", 1e-6);
  expect_close(rlhf::approx_kl(lp, lb, rlhf::KlEstimator::kK2), k["k2"], "k2", 1e-6);
  expect_close(rlhf::approx_kl(lp, lb, rlhf::KlEstimator::kK3), k["k3"], "k3", 1e-6);
  const json& f = fixture()["reinforce"];
  const std::map<std::string, rlhf::ReinforceEstimator> estimators = {
      {"reinforce", rlhf::ReinforceEstimator::kReinforce},
      {"reinforce_baseline", rlhf::ReinforceEstimator::kReinforceBaseline},
      {"rloo", rlhf::ReinforceEstimator::kRloo},
      {"group_norm", rlhf::ReinforceEstimator::kGroupNorm},
      {"dr_grpo", rlhf::ReinforceEstimator::kDrGrpo}};
  for (const json& c : f["cases"]) {
    const json& o = c["options"];
    rlhf::ReinforceOptions options;
    options.estimator = estimators.at(o["estimator"].get<std::string>());
    options.samples_per_prompt = o["samples_per_prompt"].get<int64_t>();
    options.kl_coef = o["kl_coef"].get<double>();
    options.gamma = o["gamma"].get<double>();
    options.no_std_norm = o["no_std_norm"].get<bool>();
    options.clip_low = o["clip_low"].get<double>();
    options.clip_high = o["clip_high"].get<double>();
    const rlhf::ReinforceOutput out =
        rlhf::reinforce_advantages(tensor_of(f["rewards"]), tensor_of(f["kl"]), tensor_of(f["mask"]), options);
    // The returns and advantages are computed in fp32 (as upstream): 1e-5 relative to O(1) values.
    expect_close(out.returns, c["returns"], o.dump() + " returns", 1e-5);
    expect_close(out.advantages, c["advantages"], o.dump() + " advantages", 1e-5);
  }
}

}  // namespace
}  // namespace dschat
