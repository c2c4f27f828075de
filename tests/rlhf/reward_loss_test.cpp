// Reward-model math against a Python transcription of DeepSpeed-Chat's RewardModel.forward (the
// pairwise loss over the divergent span and the end scores) and forward_value (chosen_end_scores),
// with the value head's output replaced by seeded random values: OPT-style rows (BOS = pad,
// num_padding_at_beginning 1) and LLaMA-style rows (npb 0), identical pairs, full-length rows.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dschat/core/error.h"
#include "dschat/rlhf/math/reward_loss.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

json to_json(const torch::Tensor& t) {
  torch::Tensor flat = t.detach().to(torch::kCPU).to(t.is_floating_point() ? torch::kDouble : torch::kLong)
                           .contiguous().reshape({-1});  // [numel]
  json data = json::array();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (t.is_floating_point()) data.push_back(flat[i].item<double>());
    else data.push_back(flat[i].item<int64_t>());
  }
  return {{"shape", t.sizes().vec()}, {"data", data}};
}

void expect_close(const torch::Tensor& got, const json& want, double tol, const std::string& what) {
  std::vector<double> data = want["data"].get<std::vector<double>>();
  torch::Tensor expected =
      torch::tensor(data, torch::kDouble).reshape(want["shape"].get<std::vector<int64_t>>());  // shape of got
  ASSERT_EQ(got.sizes(), expected.sizes()) << what;
  EXPECT_LE(testing::max_abs_diff(got, expected), tol) << what;
}

struct PairBatch {
  int64_t pad = 0;
  int64_t npb = 0;
  torch::Tensor ids;  // [2B, T] chosen rows, then rejected rows
};

// OPT-style (pad = eos = bos = 2, npb 1): a normal pair, an identical pair, a full-length chosen
// row, a longer rejected row, and rows differing only at their last token.
PairBatch opt_pairs() {
  return {2, 1,
          torch::tensor({{2, 5, 6, 7, 10, 11, 12, 2, 2, 2},
                         {2, 8, 9, 13, 14, 2, 2, 2, 2, 2},
                         {2, 5, 6, 30, 31, 32, 33, 34, 35, 36},
                         {2, 3, 4, 50, 2, 2, 2, 2, 2, 2},
                         {2, 7, 8, 9, 10, 2, 2, 2, 2, 2},
                         // rejected
                         {2, 5, 6, 7, 20, 21, 2, 2, 2, 2},
                         {2, 8, 9, 13, 14, 2, 2, 2, 2, 2},
                         {2, 5, 6, 40, 2, 2, 2, 2, 2, 2},
                         {2, 3, 4, 51, 52, 53, 54, 2, 2, 2},
                         {2, 7, 8, 9, 11, 2, 2, 2, 2, 2}},
                        torch::kLong)};
}

// LLaMA-style (pad 0 separate from BOS 1, npb 0): a normal pair, an identical full-length pair
// (no pad at all: c_ind = T), a full-length chosen row against a padded rejected row.
PairBatch llama_pairs() {
  return {0, 0,
          torch::tensor({{1, 5, 6, 7, 0, 0, 0, 0},
                         {1, 5, 6, 7, 8, 9, 10, 11},
                         {1, 4, 4, 4, 4, 4, 4, 4},
                         // rejected
                         {1, 5, 9, 0, 0, 0, 0, 0},
                         {1, 5, 6, 7, 8, 9, 10, 11},
                         {1, 4, 3, 0, 0, 0, 0, 0}},
                        torch::kLong)};
}

// Step-3 sequences: prompts left-padded to P = 4 (OPT BOS = pad), answers EOS-terminated; an
// unpadded answer, an empty answer and a pad inside the answer.
torch::Tensor step3_seq() {
  return torch::tensor({{2, 2, 2, 5, 6, 7, 2, 2, 2},
                        {2, 5, 6, 7, 8, 9, 10, 11, 12},
                        {2, 2, 2, 5, 2, 2, 2, 2, 2},
                        {2, 5, 6, 7, 8, 2, 9, 2, 2}},
                       torch::kLong);
}
constexpr int64_t kStep3Prompt = 4;

torch::Tensor values_for(const torch::Tensor& ids, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn(ids.sizes());  // [N, T]
}

const char* kOracle = R"PY(
import json, sys, torch
IN = json.loads(IN_TEXT)
def T(d, dtype=torch.float32): return torch.tensor(d["data"], dtype=torch.float64).reshape(d["shape"]).to(dtype)
def J(t): return {"shape": list(t.shape), "data": t.detach().double().flatten().tolist()}

# RewardModel.forward after the v_head, verbatim (self.* as arguments).
def forward(input_ids, rewards, PAD_ID, num_padding_at_beginning, compute_fp32_loss):
    chosen_mean_scores = []
    rejected_mean_scores = []
    assert len(input_ids.shape) == 2
    bs = input_ids.shape[0] // 2
    seq_len = input_ids.shape[1]
    chosen_ids = input_ids[:bs]
    rejected_ids = input_ids[bs:]
    chosen_rewards = rewards[:bs]
    rejected_rewards = rewards[bs:]
    loss = 0.
    for i in range(bs):
        chosen_id = chosen_ids[i]
        rejected_id = rejected_ids[i]
        chosen_reward = chosen_rewards[i]
        rejected_reward = rejected_rewards[i]
        c_inds = (chosen_id == PAD_ID).nonzero()
        c_ind = c_inds[num_padding_at_beginning].item() if len(c_inds) > num_padding_at_beginning else seq_len
        check_divergence = (chosen_id != rejected_id).nonzero()
        if len(check_divergence) == 0:
            end_ind = rejected_reward.size(-1)
            divergence_ind = end_ind - 1
            r_ind = c_ind
        else:
            r_inds = (rejected_id == PAD_ID).nonzero()
            r_ind = r_inds[num_padding_at_beginning].item() if len(r_inds) > num_padding_at_beginning else seq_len
            end_ind = max(c_ind, r_ind)
            divergence_ind = check_divergence[0]
        assert divergence_ind > 0
        c_truncated_reward = chosen_reward[divergence_ind:end_ind]
        r_truncated_reward = rejected_reward[divergence_ind:end_ind]
        chosen_mean_scores.append(chosen_reward[c_ind - 1])
        rejected_mean_scores.append(rejected_reward[r_ind - 1])
        if compute_fp32_loss:
            c_truncated_reward = c_truncated_reward.float()
            r_truncated_reward = r_truncated_reward.float()
        loss += -torch.nn.functional.logsigmoid(c_truncated_reward - r_truncated_reward).mean()
    loss = loss / bs
    return {"loss": loss, "chosen_mean_scores": torch.stack(chosen_mean_scores),
            "rejected_mean_scores": torch.stack(rejected_mean_scores)}

# RewardModel.forward_value's end scores, verbatim.
def forward_value(input_ids, values, PAD_ID, prompt_length):
    assert prompt_length > 1
    bs = values.size(0)
    seq_len = input_ids.shape[1]
    chosen_end_scores = []
    for i in range(bs):
        input_id = input_ids[i]
        value = values[i]
        c_inds = (input_id[prompt_length:] == PAD_ID).nonzero()
        c_ind = c_inds[0].item() + prompt_length if len(c_inds) > 0 else seq_len
        chosen_end_scores.append(value[c_ind - 1])
    return torch.stack(chosen_end_scores)

out = {"pairs": []}
for c in IN["pairs"]:
    dtype = torch.bfloat16 if c["bf16"] else torch.float32
    values = T(c["values"], dtype).requires_grad_(True)
    r = forward(T(c["ids"], torch.long), values, c["pad"], c["npb"], c["bf16"])
    r["loss"].backward()
    out["pairs"].append({"loss": r["loss"].item(), "loss_dtype": str(r["loss"].dtype),
                         "chosen": J(r["chosen_mean_scores"]), "rejected": J(r["rejected_mean_scores"]),
                         "grad": J(values.grad)})
v = IN["value"]
out["end_scores"] = J(forward_value(T(v["ids"], torch.long), T(v["values"]), v["pad"], v["prompt_length"]))
json.dump(out, open(sys.argv[1], "w"))
)PY";

struct PairCase {
  PairBatch batch;
  torch::Tensor values;  // [2B, T]
  bool bf16 = false;     // bf16 values with compute_fp32 (the --compute_fp32_loss path)
};

std::vector<PairCase> pair_cases() {
  const PairBatch opt = opt_pairs();
  const PairBatch llama = llama_pairs();
  return {{opt, values_for(opt.ids, 31), false},
          {llama, values_for(llama.ids, 32), false},
          {opt, values_for(opt.ids, 33).to(torch::kBFloat16), true}};
}

const json& oracle() {
  static const json result = [] {
    json input = {{"pairs", json::array()}};
    for (const PairCase& c : pair_cases()) {
      input["pairs"].push_back({{"ids", to_json(c.batch.ids)}, {"values", to_json(c.values)},
                                {"pad", c.batch.pad}, {"npb", c.batch.npb}, {"bf16", c.bf16}});
    }
    torch::Tensor seq = step3_seq();  // [B, T]
    input["value"] = {{"ids", to_json(seq)}, {"values", to_json(values_for(seq, 34))}, {"pad", 2},
                      {"prompt_length", kStep3Prompt}};
    return testing::run_python_json("IN_TEXT = r'''" + input.dump() + "'''\n" + kOracle);
  }();
  return result;
}

TEST(RewardLoss, PairwiseLossMatchesRewardModelForward) {
  const json& want = oracle();
  ASSERT_TRUE(want.contains("pairs"));
  const std::vector<PairCase> cases = pair_cases();
  for (size_t k = 0; k < cases.size(); ++k) {
    const PairCase& c = cases[k];
    const json& w = want["pairs"][k];
    const std::string tag = "case " + std::to_string(k);
    torch::Tensor values = c.values.clone().requires_grad_(true);  // [2B, T]
    rlhf::RewardLossOutput out = rlhf::reward_pairwise_loss(c.batch.ids, values, c.batch.pad, c.batch.npb, c.bf16);
    EXPECT_EQ(out.loss.scalar_type(), torch::kFloat) << tag;
    EXPECT_EQ(w["loss_dtype"].get<std::string>(), "torch.float32") << tag;
    EXPECT_NEAR(out.loss.item<double>(), w["loss"].get<double>(), 1e-6) << tag;
    expect_close(out.chosen_end_scores, w["chosen"], 0.0, tag + " chosen end scores");
    expect_close(out.rejected_end_scores, w["rejected"], 0.0, tag + " rejected end scores");
    out.loss.backward();
    expect_close(values.grad(), w["grad"], 1e-6, tag + " gradient");
  }
}

TEST(RewardLoss, PairIndicesFollowTheDivergenceRules) {
  const PairBatch opt = opt_pairs();
  auto idx = [&](int64_t pair) { return rlhf::reward_pair_indices(opt.ids[pair], opt.ids[5 + pair], 2, 1); };
  rlhf::PairIndices normal = idx(0);
  EXPECT_EQ(normal.chosen_end, 7);
  EXPECT_EQ(normal.rejected_end, 6);
  EXPECT_EQ(normal.divergence, 4);
  EXPECT_EQ(normal.span_end, 7);
  rlhf::PairIndices same = idx(1);  // identical rows: only the last position, r_ind = c_ind
  EXPECT_EQ(same.divergence, 9);
  EXPECT_EQ(same.span_end, 10);
  EXPECT_EQ(same.rejected_end, same.chosen_end);
  EXPECT_EQ(same.chosen_end, 5);
  EXPECT_EQ(idx(2).chosen_end, 10);  // no pad after the BOS: T
  EXPECT_EQ(idx(4).span_end - idx(4).divergence, 1);
}

TEST(RewardLoss, EndScoresMatchForwardValue) {
  torch::Tensor seq = step3_seq();  // [B, T]
  torch::Tensor values = values_for(seq, 34).requires_grad_(true);  // [B, T]
  torch::Tensor scores = rlhf::reward_end_scores(seq, values, 2, kStep3Prompt);  // [B]
  expect_close(scores, oracle()["end_scores"], 0.0, "chosen_end_scores");
  // Positions 5, 8, 3 (an empty answer scores the last prompt token) and 4 (the first pad wins).
  torch::Tensor expected =
      values.detach().gather(1, torch::tensor({5, 8, 3, 4}, torch::kLong).unsqueeze(1)).squeeze(1);  // [B]
  EXPECT_TRUE(torch::equal(scores.detach(), expected));
  scores.sum().backward();
  EXPECT_EQ(values.grad().sum().item<float>(), 4.0f);
}

TEST(RewardLoss, RejectsWhatDeepSpeedChatAssertsOrTurnsIntoNaN) {
  const PairBatch opt = opt_pairs();
  torch::Tensor values = torch::zeros(opt.ids.sizes());  // [2B, T]
  // OPT rows read with npb 0: c_ind = 0 (the BOS), where DS-Chat indexes values[-1] and averages
  // an empty span into NaN.
  EXPECT_THROW_WITH(rlhf::reward_pairwise_loss(opt.ids, values, 2, 0), core::InvalidArgument,
                    "begins with the pad id 2");
  torch::Tensor differ_first = torch::tensor({{3, 5, 2}, {4, 5, 2}}, torch::kLong);  // [2, 3]
  EXPECT_THROW_WITH(rlhf::reward_pairwise_loss(differ_first, torch::zeros({2, 3}), 2, 0), core::InvalidArgument,
                    "differ at position 0");
  EXPECT_THROW_WITH(rlhf::reward_pairwise_loss(opt.ids.slice(0, 0, 3), torch::zeros({3, 10}), 2, 1),
                    core::InvalidArgument, "[2B, T]");
  EXPECT_THROW_WITH(rlhf::reward_end_scores(step3_seq(), torch::zeros({4, 9}), 2, 1), core::InvalidArgument,
                    "prompt_length must be greater than 1");
}

}  // namespace
}  // namespace dschat
